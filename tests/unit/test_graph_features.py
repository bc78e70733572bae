"""The graph-feature registry (transforms/features/registry.py) refuses a
table that breaks a feature's declared order or shares a field or key range;
the registered table is one it accepts, and its fields are the Analysis's."""
import dataclasses

import pytest

from autopar.transforms.analysis import Analysis
from autopar.transforms.features.base import GraphFeature
from autopar.transforms.features.registry import FEATURES, check_table
from autopar.transforms.keys import LOSS_COUNTS


def _feature(name, after=(), fields=(), keys=()):
    return type(name, (GraphFeature,), {"name": name, "after": after, "fields": fields,
                                        "keys": keys})()


def test_a_feature_before_one_it_must_follow_is_refused():
    with pytest.raises(AssertionError, match="'b' must come after 'a', which comes after it"):
        check_table((_feature("b", after=("a",)), _feature("a")))


def test_a_feature_following_an_unregistered_one_is_refused():
    with pytest.raises(AssertionError, match="'b' must come after 'x', which is not registered"):
        check_table((_feature("a"), _feature("b", after=("x",))))


def test_two_features_claiming_one_field_or_key_range_are_refused():
    with pytest.raises(AssertionError, match="field 'f' claimed by 'a' and 'b'"):
        check_table((_feature("a", fields=("f",)), _feature("b", fields=("f",))))
    with pytest.raises(AssertionError, match="claimed by 'a' and 'b'"):
        check_table((_feature("a", keys=(LOSS_COUNTS,)), _feature("b", keys=(LOSS_COUNTS,))))


def test_the_registered_table_is_accepted_and_fills_analysis_fields():
    assert list(check_table(tuple(FEATURES.values()))) == list(FEATURES)
    analysis_fields = {f.name for f in dataclasses.fields(Analysis)}
    for feature in FEATURES.values():
        assert set(feature.fields) <= analysis_fields, feature.name
    # in an order its declarations allow
    names = list(FEATURES)
    for feature in FEATURES.values():
        assert all(names.index(a) < names.index(feature.name) for a in feature.after)
