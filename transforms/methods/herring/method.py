"""Herring (sharded summation servers over balanced fusion buffers): dense
float32 gradients are packed into the buffers of transforms.methods.herring.bfb, each buffer
is pushed to the summation servers (shard i to server i) and pulled back
summed, then unpacked into per-variable gradients before anything consumes
them (clipping, the update), as with all-reduce. The variable stays
replicated on every worker.

A buffer's push depends only on its own gradients, so the first buffers
(the last layers' gradients) travel while the rest of the backward pass runs.

Hierarchy (Herring §IV steps 1-5, Parallax's local aggregation): with
Plan.local_aggregation and several workers on a host, the host's workers sum
each buffer among themselves first (a TensorFlow collective in the host
group), the host's first worker alone pushes it to the servers (one
contributor per host) and broadcasts the result back within the host.

The transport is transport.push_pull here (the native cpp_ops op); server
addresses are not in the graph (the runtime gives them to the op).
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from autopar.common.text import human_bytes
from autopar.common.errors import SpecError
from autopar.transforms.methods.base import Edits, RewriteContext, SyncMethod, VariablePlan
from autopar.transforms.methods.wire import COLLECTIVES, WIRE_BYTES, narrowed
from autopar.transforms.methods.herring import transport
from autopar.transforms.methods.herring.bfb import FusionLayout, plan_layout
from autopar.transforms.methods.herring.sumserver import SUMMATION_SERVER
from autopar.transforms.ops import ConstantPool, reshape
from autopar.transforms.topology import DEFAULT_LINK_GBPS

# The dtype the summation servers add; other dense gradients stay on the ring.
HERRING_DTYPE = "float32"


@dataclass
class HerringState:
    """What the compiled plan keeps: the balanced fusion buffers of herring's
    gradients (None when it has none), and why the job uses herring or not."""
    layout: FusionLayout | None = None
    why: str = ""


class Herring(SyncMethod):
    name = "herring"
    State = HerringState
    # Its transport narrows the float32 gradients it carries to either (the
    # servers add float32).
    wire_dtypes = {"float16": (HERRING_DTYPE,), "bfloat16": (HERRING_DTYPE,)}
    # The summation servers its transport pushes to and pulls from.
    process_kinds = (SUMMATION_SERVER,)

    def job_choice(self, topology, options, required, analysis):
        """Whether dense float32 gradients go through herring, and why."""
        missing = topology.missing(SUMMATION_SERVER.role)
        if required:
            if topology.num_servers == 0:
                raise SpecError("run_option='herring' sums gradients on server processes, but "
                                "the resource spec has none: give some hosts `servers: 1` (one "
                                "per host is a good start), or use run_option='allreduce'")
            if missing:
                raise SpecError(f"run_option='herring' needs summation servers: {missing}")
            if missing is not None:
                raise SpecError("run_option='herring' needs summation servers, but this job was "
                                "started without them: a job joined through TF_CONFIG starts one "
                                "runtime/autopar_sumserver per server and names them in "
                                "AUTOPAR_SUMSERVERS=host:port,... for every worker (or launch "
                                "the job with `autopar launch`, which starts them)")
            return True, "run_option='herring'"
        if topology.num_servers == 0:
            return False, ""
        if missing:
            return False, (f"no summation servers ({missing}), so dense "
                           "gradients stay on ring all-reduce")
        if missing is not None:
            return False, ("no summation servers in this job (joined through TF_CONFIG without "
                           "AUTOPAR_SUMSERVERS), so dense gradients stay on ring all-reduce")
        if topology.on_loopback:
            # The cost model counts bytes on network links; here every byte
            # stays in one machine's memory, and herring's extra processes and
            # packing copies only cost (measured: bench/ps_profile.py).
            return False, ("every worker host is a loopback address: one machine, no network "
                           "link for herring to save bytes on, so dense gradients stay on ring "
                           "all-reduce (run_option='herring' forces herring)")
        if len(topology.hosts) == 1:
            # The ring among one host's workers stays in its memory; herring
            # would send the gradients out to servers and back.
            return False, (f"every worker runs on one host ({topology.hosts[0]}): their ring "
                           "all-reduce crosses no network link, so dense gradients stay on it "
                           "(run_option='herring' forces herring)")
        model = sum(v.bytes for v in analysis.variables
                    if v.gradient == "dense" and v.dtype == HERRING_DTYPE)
        return predicted_faster(topology.num_workers, len(topology.hosts), topology.num_servers,
                                options.local_aggregation, options.wire_dtype, model,
                                topology.link_gbps)

    def declines(self, v, topology, options):
        if v.dtype != HERRING_DTYPE:
            return (f"kept off herring: the summation servers add {HERRING_DTYPE}, which would "
                    f"lose a {v.dtype} gradient's precision")
        return ""

    def reason(self, v, options):
        return ("dense gradient: balanced fusion buffers sharded over the summation servers, "
                "M bytes per contributor")

    def prepare(self, analysis, names, topology, options, fusion_bytes, key, job_why=""):
        """The fusion layout of `names`, two host-group keys per buffer, and
        why the job uses herring or not (`job_why`)."""
        if not names:
            return HerringState(None, job_why), key
        layout = plan_layout(analysis, names, topology.num_servers,
                             self.wire_dtype(HERRING_DTYPE, options) or HERRING_DTYPE,
                             options.herring_buffer_bytes)
        for b in layout.buffers:
            b.la_key = key
            key += 2
        return HerringState(layout, job_why), key

    def variable_plan(self, v, reason, state, key):
        """partitions/servers: the element ranges [start, end) of the flattened
        gradient and the server summing each (what the report counts)."""
        state = state.layout
        partitions, servers = [], []
        for b in state.buffers:
            for seg in b.segments:
                if seg.variable != v.name:
                    continue
                for shard in b.shards:   # the shards this segment overlaps
                    lo = max(seg.offset, shard.offset)
                    hi = min(seg.offset + seg.length, shard.offset + shard.length)
                    if lo < hi:
                        start = seg.start + lo - seg.offset
                        partitions.append([start, start + hi - lo])
                        servers.append(shard.server)
        buffers = state.buffers_of(v.name)
        where = (f"replicated; buffer {buffers[0]}" if len(buffers) == 1 else
                 f"replicated; buffers {buffers[0]}-{buffers[-1]}") if buffers else "replicated"
        placement = f"{where} summed on {len(set(servers))} server(s)"
        return VariablePlan(v.name, self.name, placement, reason, partitions=partitions,
                            servers=servers, wire_dtype=state.wire_dtype), key

    on_servers = True

    def bytes_per_worker(self, nbytes, num_workers):
        """Each contributor pushes its gradient once and pulls the sum once;
        with local aggregation that is the host's first worker, the others
        exchange it within the host."""
        return float(nbytes)

    def bytes_at_servers(self, nbytes, num_workers, contributors):
        """Every contributor's gradient comes in; the sum goes back to each."""
        return contributors * nbytes, contributors * nbytes

    def hops(self, num_workers):
        return 2

    def wire_bytes(self, v, vp, num_workers, alpha):
        sent = self.bytes_per_worker(sum(e - s for s, e in vp.partitions)
                                     * _wire_bytes_per_element(vp), num_workers)
        return sent, sent

    def server_bytes(self, v, vp, num_workers, contributors, alpha):
        """Each server's share: the byte model on its shard, in the wire dtype."""
        wire = _wire_bytes_per_element(vp)
        return [(server, *self.bytes_at_servers((e - s) * wire, num_workers, contributors))
                for (s, e), server in zip(vp.partitions, vp.servers)]

    def report_fields(self, plan):
        state = self.state(plan)
        layout = state.layout
        buffers = [] if layout is None else [
            {"index": b.index, "elements": b.elements,
             "wire_bytes": b.elements * WIRE_BYTES[layout.wire_dtype],
             "wire_dtype": layout.wire_dtype,
             "segments": [[s.variable, s.start, s.offset, s.length] for s in b.segments],
             "shards": [[s.server, s.offset, s.length] for s in b.shards]}
            for b in layout.buffers]
        return {"herring_buffers": buffers, "herring_why": state.why}

    def processes(self, plan):
        return {SUMMATION_SERVER.role} if self.state(plan).layout is not None else set()

    def transport(self):
        """The push/pull op builder (transport.push_pull)."""
        return transport.push_pull

    def rewrite(self, ctx: RewriteContext) -> Edits:
        plan, layout = ctx.plan, self.state(ctx.plan).layout
        edits = Edits()
        if layout is None:
            return edits
        graph, analysis, backend = ctx.graph, ctx.analysis, ctx.backend
        push_pull = self.transport()
        hosts = plan.topology.hosts
        host_key, members = plan.host_group(ctx.worker_index)
        la = plan.local_aggregation and len(members) > 1
        leader = members[0] == ctx.worker_index
        host = backend.subgroup(len(members), host_key) if la else None
        contributors = plan.contributions_per_step()
        me = (hosts.index(plan.worker_hosts[ctx.worker_index]) if plan.local_aggregation
              else ctx.worker_index)
        mean = plan.averages("dense")
        # With local aggregation every contributor is a host's sum (a host of
        # one worker contributes its own gradient): all push sums, with the
        # same average flag, and the mean is taken here. Without it the
        # servers average the workers' contributions.
        server_average = mean and not plan.local_aggregation
        minus_one = ctx.constants.get([-1])
        grads = {name: graph.get_tensor_by_name(analysis.variable(name).grad_tensor)
                 for name in layout.order}
        outputs = []
        # Host collectives in one launch order on every worker: reduces
        # chained, broadcasts chained, within each train group (a step of
        # one train op must not run another's).
        previous_host: dict[int, list] = {}
        previous_bcast: dict[int, list] = {}
        with tf.name_scope("autopar/herring/"):
            flat = {name: reshape(g, minus_one) for name, g in grads.items()}
            for b in layout.buffers:
                group = analysis.variable(b.segments[0].variable).group
                pieces = [_slice(flat[s.variable], s.start, s.length, grads[s.variable],
                                 ctx.constants) for s in b.segments]
                packed = pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=0)
                if la:
                    # One launch order of host collectives on every worker.
                    with tf.control_dependencies(previous_host.get(group, [])):
                        packed = host.allreduce_sum(packed, b.la_key)
                    previous_host[group] = [packed]
                # Pushes are not chained: the op is asynchronous (it holds no
                # thread while it waits) and servers match contributions by
                # buffer id, so several buffers can be in flight at once.
                if la and not leader:
                    summed = packed   # only the leader's result is used
                else:
                    summed = push_pull(packed, b, num_contributors=contributors,
                                       contributor_index=me,
                                       wire_dtype=layout.wire_dtype, average=server_average)
                if la:
                    # The leader's result to the host. A receiver reads only
                    # the static shape of its host sum: the control edge
                    # keeps that sum (a collective its peers wait in) from
                    # being pruned out of the step.
                    with tf.control_dependencies(previous_bcast.get(group, []) + [packed]):
                        summed = host.broadcast(summed, b.la_key + 1, is_source=leader)
                    previous_bcast[group] = [summed]
                if mean and plan.local_aggregation:   # the host sums add up to the global sum
                    summed = summed / ctx.constants.get(float(plan.num_workers), tf.float32)
                outputs.append(summed)
            # Unpacking: a slice per segment, their concatenation and a
            # reshape per variable, written as NodeDefs (ctx.nodes): through
            # the Python op API they were a third of a hybrid rewrite.
            segments: dict[str, list] = {}
            for b in layout.buffers:
                for s in b.segments:
                    segments.setdefault(s.variable, []).append((b, s))
            nodes = ctx.nodes
            for name, g in grads.items():
                dtype = g.dtype.base_dtype
                pieces = [nodes.add("StridedSlice", [
                    outputs[b.index], *(nodes.pooled_const([k], tf.int32)
                                        for k in (s.offset, s.offset + s.length, 1))],
                    T=dtype, Index=tf.int32) for b, s in segments.get(name, [])]
                if not pieces:
                    continue   # an empty variable: nothing to average
                whole = (pieces[0] if len(pieces) == 1 else nodes.add(
                    "ConcatV2", [*pieces, nodes.pooled_const(0, tf.int32)], N=len(pieces),
                    T=dtype, Tidx=tf.int32))
                shape = (nodes.pooled_const(g.shape.as_list(), tf.int32)
                         if g.shape.is_fully_defined() else tf.shape(g))
                edits.replaced[g.name] = nodes.add("Reshape", [whole, shape], T=dtype,
                                                   Tshape=tf.int32) + ":0"
        return edits


def _slice(flat: tf.Tensor, start: int, length: int, grad: tf.Tensor,
           constants: ConstantPool) -> tf.Tensor:
    if start == 0 and length == grad.shape.num_elements():
        return flat
    return constants.rows(flat, start, start + length)


def _wire_bytes_per_element(vp: VariablePlan) -> int:
    return WIRE_BYTES[vp.wire_dtype or HERRING_DTYPE]


# Herring is chosen when its busiest link saves at least this much time per
# step at the link speed: it starts S more processes and packs the
# gradients into buffers every step, which a model of a few kilobytes does
# not pay back (measured on loopback, 2 workers, a 1 KB model: the same step
# time as the ring, so no gain to pay for them).
MIN_SAVING_S = 1e-3


def predicted_faster(num_workers: int, num_hosts: int, num_servers: int,
                     local_aggregation: bool, wire_dtype: str, model_bytes: float,
                     link_gbps: float | None = None) -> tuple[bool, str]:
    """Hybrid's choice for dense float32 gradients: herring when its busiest
    link moves fewer bytes per step than ring all-reduce's by at least
    MIN_SAVING_S of link time, for a model of M = ``model_bytes`` with every
    link equally fast (the spec's speed, else DEFAULT_LINK_GBPS). Ring:
    2(N-1)/N x M per worker link. Herring: M x w per contributor link (w =
    wire bytes / 4) and M x w x C / S per server link (C contributors: hosts
    with local aggregation, else workers; S servers). The ring sends float16
    too when that is the wire dtype (x w; TensorFlow's collectives carry no
    bfloat16: wire.COLLECTIVES). Servers sharing a host's link with its workers are not
    modelled."""
    n, s = num_workers, num_servers
    if s == 0:
        return False, "the spec has no server processes"
    c = num_hosts if local_aggregation else n
    w = WIRE_BYTES[wire_dtype] / 4
    w_ring = WIRE_BYTES[narrowed("float32", wire_dtype, COLLECTIVES) or "float32"] / 4
    ring = 2 * (n - 1) / n * w_ring
    herring = max(w, w * c / s)
    gbps = link_gbps or DEFAULT_LINK_GBPS
    seconds_per_m = model_bytes * 8 / (gbps * 1e9)
    ring_s, herring_s = ring * seconds_per_m, herring * seconds_per_m
    saving = ring_s - herring_s
    faster = saving >= MIN_SAVING_S
    if faster:
        verdict = (f"herring is predicted faster by {saving * 1e3:.1f} ms per step "
                   f"({ring_s / herring_s:.2f}x less link time)")
    elif saving > 0:
        verdict = (f"herring would save {saving * 1e3:.3f} ms per step, less than the "
                   f"{MIN_SAVING_S * 1e3:g} ms its servers and buffers must pay back: ring "
                   "all-reduce is kept")
    else:
        verdict = ("ring all-reduce is predicted faster"
                   + (f" by {-saving * 1e3:.1f} ms per step" if saving < 0 else " (a tie)"))
    why = (f"cost model for M = {human_bytes(model_bytes)} of dense float32 gradients at "
           f"{gbps:g} Gbit/s per link{'' if link_gbps else ' (assumed: the spec gives none)'}: "
           f"ring all-reduce moves 2(N-1)/N{' x w' if w_ring != 1 else ''} = {ring:.2f} M per "
           f"worker link ({ring_s * 1e3:.3f} ms); herring moves {w:.2f} M per contributor link "
           f"and {w * c / s:.2f} M per server link ({c} contributors, {s} servers; "
           f"{herring_s * 1e3:.3f} ms): {verdict}")
    return faster, why
