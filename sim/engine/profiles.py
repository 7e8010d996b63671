"""Step-time profiles: how long one engine step takes on a given GPU and model.

A vLLM V1 step runs one forward pass over a flat batch that mixes prefill
chunks and single decode tokens.  Its duration is modeled as the sum of four
terms, each tied to a hardware figure:

    t = fixed_s                          # read all weights once + launch overhead
      + prefill_s_per_token * P          # compute-bound GEMMs for P prefill tokens
      + decode_s_per_seq    * D          # per-sequence GEMM/sampling work for D decodes
      + kv_read_s_per_token * C          # attention reads the KV of C context tokens

where ``C`` is the number of already-cached tokens every scheduled request
attends to.  Decode at small batch is memory-bound (the ``fixed_s`` weight
read dominates); it grows with batch size (``D``) and context (``C``), which is
what makes a replica with a long queue slower per token, and prefill of a long
prompt is compute-bound and linear in its length.

Calibration of ``l4-llama3.1-8b`` (Llama-3.1-8B on one NVIDIA L4, vLLM, FP8
weights so that the 24 GB card keeps room for KV cache):

* L4 datasheet: 300 GB/s memory bandwidth, 121 dense FP16/BF16 TFLOPS
  (242 dense FP8).  Llama-3.1-8B: 32 layers, 8 KV heads x 128 dims.
* Weights ~8.5 GB in FP8 -> 28 ms per full read at 300 GB/s; with kernel
  launch and sampling overhead ``fixed_s = 30 ms``.  This matches the
  30-40 ms inter-token latency commonly reported for a single stream.
* Prefill: ~2 x 8e9 FLOPs per token.  Published vLLM runs on one L4 show a
  time-to-first-token of about 0.3 s for a 512-token prompt, i.e. about
  30 TFLOPS effective (25 % of BF16 peak, typical for this card): after the
  fixed term, ``prefill_s_per_token = 0.53 ms``.
* KV cache in FP16: 2 (K,V) x 32 layers x 8 heads x 128 dims x 2 bytes =
  128 KiB per token; read at 300 GB/s -> ``kv_read_s_per_token = 0.44 us``.
  A batch of 32 requests with 1 000 tokens of context adds ~14 ms per step.
* ``decode_s_per_seq = 0.3 ms``: the per-token GEMM work that stops hiding
  under the weight read once the batch is large (64 sequences add ~19 ms).

So a lone decode step is ~31 ms; 64 sequences at 2 000 tokens of context take
~105 ms; prefilling 512 tokens takes ~0.30 s.

``h100-llama3.1-8b`` scales the same terms to an H100 SXM (3.35 TB/s,
989 dense BF16 TFLOPS, BF16 weights of 16 GB -> ~5 ms read, ~40 % MFU in
prefill): ~7 ms decode steps and ~27 ms for a 512-token prefill.

These are assumptions for benchmarking routing policies, not measurements: the
relative costs (prefill vs decode, queueing vs cache hits) are what matter.

Each profile also fixes the engine's *shape*, as vLLM would size it on that
card: the KV cache in tokens (``kv_tokens``), the context limit
(``max_model_len``), and the scheduler's ``max_num_seqs`` and
``max_num_batched_tokens``.  ``EngineConfig.for_profile`` applies them and
lets flags override each (``--kv-tokens``/``--kv-blocks``, ``--max-model-len``).

* ``l4-llama3.1-8b``: 32k tokens of KV, 8k context, 64 sequences, 2k-token
  batches: the emulator's long-standing defaults, where continuous batching
  absorbs most load imbalance.
* ``l4-llama3.1-8b-small-kv``: the same L4 step times with a quarter of the
  KV (8,192 tokens = 512 blocks).  It is the regime where the prefix cache
  *thrashes* under imbalance, as the SGLang replicas of SkyLB's evaluation
  did: a replica that receives more than its share of long conversations
  evicts their history before the next turn, so where a request lands decides
  its hit rate.  Pair it with longer prompts (``conversations:system_tokens=2048``).
* ``h100-llama3.1-8b``: H100-80GB, BF16 Llama-3.1-8B, vLLM's defaults for an
  80 GB card (``max_num_seqs`` 1024, ``max_num_batched_tokens`` 8192) and the
  model's full 128k context.  KV capacity from memory (``kv_tokens_from_memory``):
  80 GiB x 0.90 (vLLM's ``--gpu-memory-utilization``) - 16.06 GB of weights
  - 4 GiB activation/CUDA-graph reserve = 56.95 GB, at 128 KiB per token
  (2 x 32 layers x 8 KV heads x 128 dims x 2 bytes) = 434,527 tokens.

``zero`` models no GPU at all: every step takes no time, so a replica emits
tokens as fast as its HTTP server can write them.  It exists for measuring
the balancer itself (``manage.py bench proxy``): with the backends costing
nothing, whatever the proxy adds is what the benchmark sees.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
# Llama-3.1-8B in BF16: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.
LLAMA31_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
LLAMA31_8B_BF16_WEIGHT_BYTES = 16_060_000_000  # 8.03e9 parameters x 2 bytes


def kv_tokens_from_memory(
    *,
    gpu_bytes: int,
    weight_bytes: int,
    kv_bytes_per_token: int,
    memory_utilization: float = 0.90,
    activation_reserve_bytes: int = 4 * GIB,
) -> int:
    """Tokens of KV cache a vLLM engine gets: what its share of the card leaves after
    weights and the activation reserve, divided by one token's K and V."""
    free = gpu_bytes * memory_utilization - weight_bytes - activation_reserve_bytes
    if free <= 0:
        raise ValueError("the weights and activation reserve leave no room for a KV cache")
    return int(free // kv_bytes_per_token)


@dataclass(frozen=True)
class StepTimeProfile:
    """Coefficients of the step-time model above, in seconds, and the engine's shape."""

    name: str
    fixed_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float
    kv_read_s_per_token: float
    kv_tokens: int = 32_768
    max_model_len: int = 8_192
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2_048

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Modeled duration of one step; zero when nothing is scheduled."""
        return self.step(prefill_tokens, decode_seqs, context_tokens)[0]

    def step(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int
    ) -> tuple[float, tuple[float, float, float]]:
        """``step_seconds`` and ``step_terms`` from one evaluation of the model, for
        the engine, which needs both for every step it runs."""
        fixed, prefill, decode, context = self._terms(prefill_tokens, decode_seqs, context_tokens)
        return fixed + prefill + decode + context, (fixed, prefill, decode + context)

    def step_terms(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int
    ) -> tuple[float, float, float]:
        """``step_seconds`` in three parts, which sum to it up to rounding: the fixed
        weight read, the prefill chunks' GEMMs, and what grows with the batch (each
        decoding sequence's GEMM share and the attention reads of every scheduled
        request's context).  A router moves the last two only: the prefill by what
        it leaves uncached, the batch by how evenly it spreads running requests."""
        return self.step(prefill_tokens, decode_seqs, context_tokens)[1]

    def _terms(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int
    ) -> tuple[float, float, float, float]:
        """The four terms of the module docstring's step model; all zero for a step
        that schedules nothing."""
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0, 0.0, 0.0, 0.0
        return (
            self.fixed_s,
            self.prefill_s_per_token * prefill_tokens,
            self.decode_s_per_seq * decode_seqs,
            self.kv_read_s_per_token * context_tokens,
        )


PROFILES: dict[str, StepTimeProfile] = {
    profile.name: profile
    for profile in (
        StepTimeProfile(
            name="l4-llama3.1-8b",
            fixed_s=0.030,
            prefill_s_per_token=0.53e-3,
            decode_s_per_seq=0.3e-3,
            kv_read_s_per_token=0.44e-6,
        ),
        StepTimeProfile(
            name="l4-llama3.1-8b-small-kv",
            fixed_s=0.030,
            prefill_s_per_token=0.53e-3,
            decode_s_per_seq=0.3e-3,
            kv_read_s_per_token=0.44e-6,
            kv_tokens=8_192,
        ),
        StepTimeProfile(
            name="h100-llama3.1-8b",
            fixed_s=0.007,
            prefill_s_per_token=0.04e-3,
            decode_s_per_seq=0.05e-3,
            kv_read_s_per_token=0.04e-6,
            kv_tokens=kv_tokens_from_memory(
                gpu_bytes=80 * GIB,
                weight_bytes=LLAMA31_8B_BF16_WEIGHT_BYTES,
                kv_bytes_per_token=LLAMA31_8B_KV_BYTES_PER_TOKEN,
            ),
            max_model_len=131_072,
            max_num_seqs=1024,
            max_num_batched_tokens=8192,
        ),
        # No compute: the emulated replica is limited only by its own HTTP server.
        StepTimeProfile(
            name="zero",
            fixed_s=0.0,
            prefill_s_per_token=0.0,
            decode_s_per_seq=0.0,
            kv_read_s_per_token=0.0,
        ),
    )
}


def get_profile(name: str) -> StepTimeProfile:
    """The profile registered under ``name``; a clear error lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown step-time profile {name!r}; known profiles: {known}") from None
