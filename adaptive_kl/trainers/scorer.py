"""A plain-torch stand-in for TRL 1.15's fused LM-head scorer, so that TRL 1.15 runs GRPO on a CPU.

TRL 1.15 computes per-token log-probabilities with a Triton kernel (`trl.kernels.ChunkedLogProbFunction`), which
needs a GPU. The `adaptive-kl` command, the demo, the tests and the benchmarks substitute this function for it where
training runs on a CPU and the kernel fails there (for stock TRL and our trainer alike, so comparisons stay exact).
It computes the same quantities from full logits: fine for small vocabularies (the embedded policy has ~100 tokens),
a [B, T, V] float32 tensor on large ones. TRL 1.16's kernel falls back to torch off a GPU: nothing is replaced.
"""

from __future__ import annotations

import warnings

import torch


OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


class TorchLogProbFunction:
    """Same call as `ChunkedLogProbFunction.apply`; differentiable through ordinary autograd."""

    compute_dtype = torch.float32  # like the kernel: float32 logits, always

    @classmethod
    def apply(cls, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=OPTIONAL_OUTPUTS):  # fmt: skip
        with torch.autocast(hidden.device.type, enabled=False):
            logits = hidden.to(cls.compute_dtype) @ weight.to(cls.compute_dtype).T
        if bias is not None:
            logits = logits + bias.to(cls.compute_dtype)
        logits = logits * logit_scale
        if final_logit_softcapping is not None:
            logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
        logits = logits / temperature
        log_probs = torch.log_softmax(logits, dim=-1)
        target_log_probs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        probs = log_probs.exp()
        entropy = -(probs * log_probs).sum(-1) if "entropy" in outputs else None
        log_sum_sq = torch.logsumexp(2 * log_probs, dim=-1) if "log_sum_sq_probs" in outputs else None
        mean_logits = logits.mean(-1) if "mean_logits" in outputs else None
        is_top1 = (logits.argmax(-1) == targets) if "is_top1" in outputs else None
        return target_log_probs, entropy, log_sum_sq, mean_logits, is_top1


class Float64LogProbFunction(TorchLogProbFunction):
    """The stand-in in float64, for tests that compare two loss assemblies to ~1e-12 on any CPU: in float32 their
    summation orders differ by rounding that the CPU's SIMD width changes and cancellation amplifies."""

    compute_dtype = torch.float64


def install_cpu_scorer_if_needed(device: str | torch.device | None = None) -> str | None:
    """Substitutes the stand-in when TRL's fused scorer fails a probe on `device`, where training will compute
    (default: `"cuda"` if available, else `"cpu"`; pass `"cpu"` with `use_cpu=True`); returns why, or None.

    Never on a GPU: its full logits would cost gigabytes per micro-batch there, and a kernel that fails on a GPU is a
    broken install to fix, which a warning says.
    """
    import trl.trainer.utils as trl_utils  # TRL's fused LM-head scorer lives there (`hooks.HOST_INTERNALS`)

    if "_ChunkedLogProbFunction" not in vars(trl_utils):  # a TRL without a fused scorer: nothing to replace
        return None
    scorer = trl_utils._ChunkedLogProbFunction  # None on TRL 1.15 without Triton: the probe fails, as off a GPU
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        hidden, weight = torch.randn(2, 4, device=device), torch.randn(5, 4, device=device)
        scorer.apply(hidden, weight, None, torch.tensor([1, 2], device=device), 1.0, 4096)
        return None
    except Exception as error:  # no Triton (None), or Triton without a GPU driver
        if device.type != "cpu":
            warnings.warn(
                f"TRL's fused LM-head scorer failed on {device} ({type(error).__name__}: {error}); it is kept (the "
                "CPU stand-in is for CPU training only): check the install of triton and torch for this GPU.",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        trl_utils._ChunkedLogProbFunction = TorchLogProbFunction  # for the whole process: stock trainers and ours
        return f"TRL's fused LM-head scorer cannot run here ({type(error).__name__}); using a plain-torch stand-in"
