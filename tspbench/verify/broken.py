"""Deliberately broken variants, for proving that the parity and accounting checks can fail.

Each entry is a context manager that patches one plausible bug into the real code path (nothing in the
schemes knows about these: no flags). Used by tests through `verify.run_case(..., breakage=NAME)`.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch


@contextlib.contextmanager
def missing_allreduce():
    """TP's g (all-reduce after the row-parallel GEMM) forgotten: each rank keeps its partial sum."""
    from tspbench.schemes import comm

    with mock.patch.object(comm._ReduceFromRegion, "forward", staticmethod(lambda ctx, x, c: x.clone())):
        yield


@contextlib.contextmanager
def wrong_zigzag_order():
    """Gathered K/V left in rank order instead of being put back in logical (un-zigzagged) order."""
    from tspbench.schemes.ops.layout import SeqLayout

    with mock.patch.object(SeqLayout, "unshard", lambda self, g, dim=1: g):
        yield


@contextlib.contextmanager
def skipped_ring_hop():
    """Every TSP clockwise weight-ring hop is dropped: each rank applies the shard it already had again."""
    from tspbench.schemes.comm import Comm, Pending
    from tspbench.schemes.ops.ring import WEIGHT_TAG

    real = Comm.start_shifts

    def start_shifts(self, hops):
        for p in real(self, hops):
            p.wait()
        for send, recv, _offset, tag, _label in hops:
            if tag == WEIGHT_TAG:
                recv.copy_(send)  # pretend the hop never happened
        return [Pending([], self.log, label, recv) for _s, recv, _o, _t, label in hops]

    with mock.patch.object(Comm, "start_shifts", start_shifts):
        yield


@contextlib.contextmanager
def missing_grad_sync():
    """Partial gradients of token-sharded replicated weights never summed over the group (neither the buckets that
    backward's gradient hooks post nor finish_grad_sync)."""
    from tspbench.schemes.base import ParallelModel

    with (
        mock.patch.object(ParallelModel, "finish_grad_sync", lambda self: None),
        mock.patch.object(ParallelModel, "_grad_ready", lambda self, p: None),
    ):
        yield


@contextlib.contextmanager
def no_reduce_to_owner():
    """TSP attention: each rank keeps its own partial weight gradient instead of reducing it to the owner."""
    from tspbench.schemes.comm import Comm, Pending

    def start_reduce(self, buf, dst, label="reduce"):
        return Pending([], self.log, label, buf)  # no reduce: the owner sees only its own partial

    with mock.patch.object(Comm, "start_reduce", start_reduce):
        yield


@contextlib.contextmanager
def unmasked_vocab_shard():
    """Vocabulary-parallel embedding / cross-entropy: ids outside this rank's slice are wrapped into it
    instead of masked, so every shard adds a wrong row (and a wrong target logit)."""
    from tspbench.schemes.ops.vocab import VocabShard

    def local_ids(self, tokens):
        local = (tokens - self.start) % self.size
        return local, torch.zeros_like(local, dtype=torch.bool)

    with mock.patch.object(VocabShard, "local_ids", local_ids):
        yield


@contextlib.contextmanager
def head_input_grad_not_reduced():
    """Vocabulary-parallel LM head without Megatron's f: each rank back-propagates only its V/T classes'
    share of the head-input gradient."""
    from tspbench.schemes.ops import vocab

    with mock.patch.object(vocab, "copy_to_region", lambda x, comm: x):
        yield


@contextlib.contextmanager
def decode_cached_everywhere():
    """Serving: every rank of the sequence group caches the new token (not just its owner), so the merged
    decode attention counts it once per rank."""
    from tspbench.schemes.ops import decode

    with mock.patch.object(decode, "is_owner", lambda position, comm: True):
        yield


@contextlib.contextmanager
def wrong_cache_position():
    """Serving: a decode step writes the new token's K/V one slot early (position − 1 in the cache), over the
    previous token's entry, so the cache loses a token and the new key sits where the last one was."""
    from tspbench.model import LayerKV

    real = LayerKV.append

    def append(self, k, v):
        if k.shape[2] == 1 and self.length > 0:  # a decode step (the prefill appends many tokens at once)
            self.length -= 1
        return real(self, k, v)

    with mock.patch.object(LayerKV, "append", append):
        yield


@contextlib.contextmanager
def ring_head_local_softmax():
    """TSP vocab=ring: the cross-entropy normalises each shard's logits on its own (a log-sum-exp that is
    reset at every ring step) instead of folding the shards into one online softmax."""
    from tspbench.schemes.ops import vocab_ring

    real = vocab_ring.ring_forward

    def ring_forward(comm, own, step, bufs=None, label="ring"):
        def reset_step(owner, buf):
            cells = step.__closure__ or ()
            for c in cells:  # the forward's running (m, l): forget the shards seen so far
                v = c.cell_contents
                if isinstance(v, dict) and "m" in v:
                    v["m"].fill_(-torch.inf)
                    v["l"].zero_()
            step(owner, buf)

        return real(comm, own, reset_step, bufs, label)

    with mock.patch.object(vocab_ring, "ring_forward", ring_forward):
        yield


@contextlib.contextmanager
def perturbed_replica_grad():
    """After the gradient sync, global rank 1 scales every gradient of a weight it holds whole (replicated over
    its group) by 3: rank 0's copy stays right, so a check that looked at rank 0 only would pass."""
    import torch.distributed as dist

    from tspbench.schemes.base import ParallelModel

    real = ParallelModel.finish_grad_sync

    def finish_grad_sync(self):
        real(self)
        if dist.get_rank() == 1:
            for name, p in self.named_local_params():
                if self.shards[name].comm is None and p.grad is not None:
                    p.grad.mul_(3)

    with mock.patch.object(ParallelModel, "finish_grad_sync", finish_grad_sync):
        yield


@contextlib.contextmanager
def kv_head_wrong_group():
    """GQA with fewer KV heads than ranks: the replicated W_K/W_V gradients are summed over a strided group (ranks
    r, r + n_kv, …: replicas of different KV heads) instead of the run of ranks that holds the same head."""
    from tspbench.schemes.ops import sharding

    def block_rows(ranks, dims, axes, block_axis, block):
        keep = [i for i, a in enumerate(dims) if a not in axes and a != block_axis]
        summed = [dims.index(a) for a in axes]
        t = ranks.permute(*keep, *summed, dims.index(block_axis)).unflatten(-1, (block, -1)).movedim(-1, len(keep))
        return t.reshape(-1, t[(0,) * (len(keep) + 1)].numel()).tolist()

    with mock.patch.object(sharding, "block_rows", block_rows):
        yield


@contextlib.contextmanager
def fsdp_no_reduce_scatter():
    """FSDP without the gradient reduce-scatter: each rank keeps its own rows of its own unsharded gradient (its
    tokens' partial sum) instead of the sum over dp × Σ (schemes/fsdp_sp.py)."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    def skip(self, output_tensor, input_tensor, group, op, async_op=False):
        output_tensor.copy_(input_tensor.chunk(dist.get_world_size(group))[dist.get_rank(group)])

    with mock.patch.object(DefaultReduceScatter, "__call__", skip):
        yield


@contextlib.contextmanager
def msp_without_reduce_scatter():
    """tp_sp with Megatron-SP on the T axis: the exits of attention and MLP keep their own piece of the
    row-parallel partial sum instead of reduce-scattering (summing) it over the tensor group."""
    from tspbench.schemes import tp_sp
    from tspbench.schemes.ops import tensor_parallel

    def keep_piece(y, comm, dim):
        return y.chunk(comm.size, dim)[comm.rank].contiguous()

    with (
        mock.patch.object(tp_sp, "reduce_scatter_to_sequence", keep_piece),
        mock.patch.object(tensor_parallel, "reduce_scatter_to_sequence", keep_piece),
    ):
        yield


@contextlib.contextmanager
def ulysses_wrong_dim():
    """Ulysses all-to-all on the wrong dimension: the received chunks are concatenated along the dimension after
    the gather dimension (the batch instead of the sequence) and reshaped to the expected shape: shapes stay
    right, tokens and heads are scrambled."""
    from tspbench.schemes.comm import Comm, Pending

    real = Comm.all_to_all
    real_start = Comm.start_all_to_all

    def all_to_all(self, x, scatter_dim, gather_dim):
        out = real(self, x, scatter_dim, gather_dim + 1)
        shape = list(x.shape)
        shape[scatter_dim] //= self.size
        shape[gather_dim] *= self.size
        return out.reshape(shape)

    def wrong_dim(out):  # [Σ (source), S/Σ, B, …]: the sources concatenated along B instead of the sequence
        return out.copy_(out.movedim(0, 2).reshape(out.shape).clone())

    def start_all_to_all(self, chunks, label="all_to_all"):  # ops/ulysses.py's exchanges
        pending = real_start(self, chunks, label)
        return Pending(pending.works, self.log, label, pending.result, finish=wrong_dim, keep=pending.keep)

    with (
        mock.patch.object(Comm, "all_to_all", all_to_all),
        mock.patch.object(Comm, "start_all_to_all", start_all_to_all),
    ):
        yield


@contextlib.contextmanager
def ring_dkv_not_returned():
    """Ring attention (sp_variant=ring): the [dK; dV] accumulator is not sent back along the reverse hops; each rank
    receives zeros, so a block's gradient keeps only the partial of the rank that held it last. Forward is exact."""
    from tspbench.schemes.comm import Comm

    real = Comm.start_shift

    def start_shift(self, send, recv, offset=1, tag=0, label="send_recv"):
        pending = real(self, send, recv, offset, tag, label)
        if label.startswith("ring_attn:") and ":bwd:" in label:
            pending.finish = lambda r: r.zero_()
        return pending

    with mock.patch.object(Comm, "start_shift", start_shift):
        yield


@contextlib.contextmanager
def kv_bucket_wrong_heads():
    """TSP's bucketed K/V all-gather (kv_bucket_heads > 0) gathers the first bucket's KV heads for every bucket, so
    bucket b's queries attend to bucket 0's keys and values. With one bucket per owner (kv_bucket_heads=0, or as
    many heads as the owner has) nothing changes: only the bucketed path is wrong."""
    from tspbench.schemes.ops.owner_attention import OwnerPlan

    real = OwnerPlan.gather

    def gather(self, k, v, lo, hi, label):
        return real(self, k, v, 0, hi - lo, label)  # the right number of heads, the wrong ones

    with mock.patch.object(OwnerPlan, "gather", gather):
        yield


@contextlib.contextmanager
def grad_bucket_posted_early():
    """The overlapped gradient sync posts a bucket's all-reduce when its FIRST gradient has arrived instead of its
    last (schemes/base.py ParallelModel._bucket_ready): the bucket packs only the gradients present, and those
    accumulated later are never reduced (each rank keeps its own partial sum of them, not averaged over dp)."""
    from tspbench.schemes.base import ParallelModel

    with (
        mock.patch.object(ParallelModel, "_bucket_ready", staticmethod(lambda b: len(b.arrived) >= 1)),
        mock.patch.object(ParallelModel, "_late_grad", lambda self, p: None),
    ):
        yield


@contextlib.contextmanager
def hsdp_no_replicate_all_reduce():
    """HSDP (fsdp_sp with dp_shard < dp) without its all-reduce over the replicate group: each shard group keeps the
    reduce-scatter of its own replicas' gradients (divided by all dp) instead of the sum over every replica."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    class NoAllReduce:
        """torch.distributed as FSDP's reduction sees it, less the all-reduce."""

        def __getattr__(self, name):
            return getattr(dist, name)

        @staticmethod
        def all_reduce(tensor, *args, **kwargs):
            return None

    with mock.patch.object(_fsdp_collectives, "dist", NoAllReduce()):
        yield


@contextlib.contextmanager
def tp_dgrad_not_reduced():
    """Megatron's column-parallel backward (schemes/ops/tensor_parallel.py) posts no reduction of its dgrad: with
    Megatron-SP each rank keeps its own piece of its partial input gradient instead of the reduce-scatter, without
    it its partial gradient instead of the all-reduce (the head shards' contributions never summed)."""
    from tspbench.schemes.comm import Pending
    from tspbench.schemes.ops import tensor_parallel

    def keep_own(dx, comm, sequence_parallel, label):
        own = dx.chunk(comm.size, 0)[comm.rank].clone() if sequence_parallel else dx
        return Pending([], comm.log, label, own)

    with mock.patch.object(tensor_parallel, "_reduce_dgrad", keep_own):
        yield


@contextlib.contextmanager
def biring_half_applied_twice():
    """TSP mlp_exchange=biring: at every step the half of a shard that came clockwise is applied twice, once in the
    place of the counter-clockwise half (whose channels are never applied): a receive-buffer mix-up between the two
    directions. Shapes agree (even halves), so only the values are wrong."""
    from tspbench.schemes import tsp

    real = tsp.rings_forward

    def rings_forward(comm, owns, step, bufs=None, label="ring", directions=(tsp.CW,)):
        held: dict[str, torch.Tensor] = {}

        def mixed(owner, piece, buf):
            if piece == 0:
                held["cw"] = buf
            step(owner, piece, held["cw"])  # the clockwise half, again for the counter-clockwise one

        return real(comm, owns, mixed, bufs, label, directions)

    with mock.patch.object(tsp, "rings_forward", rings_forward):
        yield


@contextlib.contextmanager
def mlp_broadcast_skipped():
    """TSP mlp_exchange=broadcast: the MLP shards' broadcasts never issued, so every rank applies its own shard in
    each owner's place (in forward and again in backward), as skipped_ring_hop does to the ring."""
    from tspbench.schemes.comm import Pending
    from tspbench.schemes.ops import ring

    real = ring._broadcast_shard

    def broadcast_shard(comm, own, pool, owner, label):
        if label.startswith("mlp:"):
            return Pending([], comm.log, label, own)
        return real(comm, own, pool, owner, label)

    with mock.patch.object(ring, "_broadcast_shard", broadcast_shard):
        yield


@contextlib.contextmanager
def kept_kv_wrong_owner():
    """TSP regather_kv=false: backward takes the K/V kept for the next owner instead of this owner's (an off-by-one
    in the kept list), so each owner's attention backward runs against another owner's heads. Forward is exact."""
    from tspbench.schemes.ops import owner_attention

    with mock.patch.object(owner_attention, "_kept_kv", lambda saved, owner: saved[(owner + 1) % len(saved)][6]):
        yield


@contextlib.contextmanager
def strided_first_token():
    """The decode prefill before GPU finding 1's fix: the first token's logits all-reduced as the strided slice
    `logits[:, at:at+1]` (not contiguous at B > 1). NCCL refuses it; gloo reduces the wrong memory, so ranks other
    than the one holding position S − 1 get another batch row's logits. Strict comm refuses it on CPU too."""
    import torch.distributed as dist

    from tspbench.run import loop

    def first_token_logits(pm, logits, at):
        first = logits[:, at : at + 1] if at is not None else torch.zeros_like(logits[:, :1])
        if pm.seq is not None:
            pm.seq.check("all_reduce", "prefill:first_token", first, reduce_op="sum")
            dist.all_reduce(first, group=pm.seq.group)
        return pm.full_decode_logits(first)

    with mock.patch.object(loop, "first_token_logits", first_token_logits):
        yield


@contextlib.contextmanager
def sliced_lse_to_kernel():
    """The attention backward before GPU finding 2's fix: a chunk's or head bucket's slice of the log-sum-exp (and of
    the output) handed to the kernel as it is. The CUDA flash backward reads the slice as a contiguous [B, H, L_q]
    (wrong rows for every head ≥ 1); the CPU kernel follows the strides, so only the kernel contract catches it."""
    from tspbench import attention

    with mock.patch.object(attention, "_kernel_layout", lambda *ts: ts):
        yield


BREAKAGES = {
    "missing_allreduce": missing_allreduce,
    "wrong_zigzag_order": wrong_zigzag_order,
    "skipped_ring_hop": skipped_ring_hop,
    "missing_grad_sync": missing_grad_sync,
    "no_reduce_to_owner": no_reduce_to_owner,
    "unmasked_vocab_shard": unmasked_vocab_shard,
    "head_input_grad_not_reduced": head_input_grad_not_reduced,
    "decode_cached_everywhere": decode_cached_everywhere,
    "ring_head_local_softmax": ring_head_local_softmax,
    "wrong_cache_position": wrong_cache_position,
    "perturbed_replica_grad": perturbed_replica_grad,
    "kv_head_wrong_group": kv_head_wrong_group,
    "fsdp_no_reduce_scatter": fsdp_no_reduce_scatter,
    "msp_without_reduce_scatter": msp_without_reduce_scatter,
    "ulysses_wrong_dim": ulysses_wrong_dim,
    "ring_dkv_not_returned": ring_dkv_not_returned,
    "kv_bucket_wrong_heads": kv_bucket_wrong_heads,
    "grad_bucket_posted_early": grad_bucket_posted_early,
    "hsdp_no_replicate_all_reduce": hsdp_no_replicate_all_reduce,
    "tp_dgrad_not_reduced": tp_dgrad_not_reduced,
    "biring_half_applied_twice": biring_half_applied_twice,
    "mlp_broadcast_skipped": mlp_broadcast_skipped,
    "kept_kv_wrong_owner": kept_kv_wrong_owner,
    "strided_first_token": strided_first_token,
    "sliced_lse_to_kernel": sliced_lse_to_kernel,
}
