"""The table of cross-cutting graph features (transforms.features.base for
the interface). Adding a feature: its module and one line here.

Order matters: the analysis finds and the rewrite builds features in this
order, identically on every process. Each feature declares the features it
must come after (`after`); the table is checked against those declarations
when it is built (as torch.fx's pass manager checks this_before_that), and
no two features may claim one Analysis field or one key range.
"""
from __future__ import annotations

from autopar.transforms.batchnorm import BatchNorm
from autopar.transforms.accumulate import MicroBatches
from autopar.transforms.batch_mixing import BatchMixing
from autopar.transforms.batch_weights import BatchWeights
from autopar.transforms.example_rows import ExampleRowsFeature
from autopar.transforms.features.base import Facts, GraphFeature
from autopar.transforms.local_state import LocalStateAveraging
from autopar.transforms.loss_counts import LossCounts
from autopar.transforms.padded_lengths import PaddedLengths
from autopar.transforms.random_draws import RandomDraws
from autopar.transforms.worker_counters import WorkerCounters
from autopar.transforms.wus import WeightUpdateSharding


def check_table(features: tuple[GraphFeature, ...]) -> dict[str, GraphFeature]:
    """{name: feature} of `features`, refused (AssertionError) when a
    feature comes before one it declares it must follow, names an unknown
    one, or claims a field or key range another feature claims."""
    table: dict[str, GraphFeature] = {}
    fields: dict[str, str] = {}
    ranges: dict[str, str] = {}
    for f in features:
        if not f.name or f.name in table:
            raise AssertionError(f"graph feature {f.name!r}: no name, or registered twice")
        for earlier in f.after:
            if earlier not in table:
                where = ("is not registered" if earlier not in {g.name for g in features}
                         else "comes after it in the table")
                raise AssertionError(f"graph feature {f.name!r} must come after {earlier!r}, "
                                     f"which {where}")
        for name in f.fields:
            if name in fields:
                raise AssertionError(f"Analysis field {name!r} claimed by {fields[name]!r} "
                                     f"and {f.name!r}")
            fields[name] = f.name
        for r in f.keys:
            if r.name in ranges:
                raise AssertionError(f"key range {r.name!r} claimed by {ranges[r.name]!r} "
                                     f"and {f.name!r}")
            ranges[r.name] = f.name
        table[f.name] = f
    return table


FEATURES: dict[str, GraphFeature] = check_table((
    WeightUpdateSharding(),
    BatchNorm(),
    LossCounts(),
    ExampleRowsFeature(),
    BatchWeights(),
    BatchMixing(),
    PaddedLengths(),
    RandomDraws(),
    WorkerCounters(),
    LocalStateAveraging(),
    MicroBatches(),
))


def find(facts: Facts, clock=None) -> dict:
    """{Analysis field: value} of every feature, found in table order (each
    sees what the ones before it found in facts.found). `clock(phase)`, if
    given, is called after each feature's find ("feature <name>")."""
    for f in FEATURES.values():
        facts.found.update(f.find(facts))
        if clock is not None and f.fields:
            clock(f"feature {f.name}")
    return facts.found


def feature_fetches(analysis) -> dict[str, list[str]]:
    """{what: tensors} every feature's training steps fetch (`analysis`:
    None on one device, where there are none)."""
    out: dict[str, list[str]] = {}
    if analysis is not None:
        for f in FEATURES.values():
            out.update(f.step_fetches(analysis))
    return out
