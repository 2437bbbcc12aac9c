"""Training-log lines exactly as the trainers print them, for the parser, import and CLI tests.

Each function reproduces its source's format string (field order, widths, number formats, separators):

- Megatron-LM, megatron/training/training.py (NVIDIA/Megatron-LM at d98e8a6, 2026-08-22): training_log builds
  f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]" + " iteration {:8d}/{:8d} |" + " consumed samples:
  {:12d} |" + " elapsed time per iteration (ms): {:.1f} |" + (--log-throughput) " throughput per GPU
  (TFLOP/s/GPU): {:.1f} |" + " learning rate: {:.6E} |" + " global batch size: {:5d} |" + " {key}: {:.6E} |"
  per loss (key "lm loss") + " loss scale: {:.1f} |" + " grad norm: {:.3f} |" + " number of skipped
  iterations: {:3d} |" + " number of nan iterations: {:3d} |"; evaluate_and_print_results prints
  " validation loss at {prefix} | " + "{key} value: {:.6E} | " + "{key} PPL: {:.6E} | " between two rows of
  dashes, prefix "iteration N" during training, "iteration N on validation set" / "on test set" at the end.
- AMD Primus, primus/modules/trainer/megatron/trainer.py (AMD-AGI/Primus) training_log: no timestamp in the
  string, the time and throughputs as "instant/running mean", the HIP memory, tokens per GPU, the loss after
  the global batch size; each line behind Primus' logger prefix "[YYYYmmdd HH:MM:SS][rank-R/W][INFO ]
  [--------trainer.py:LINE] : ".
- TorchTitan 0.2.2, torchtitan/components/metrics.py MetricsProcessor.log / log_validation (the `torchtitan`
  package of this project's venv): f"{color.red}step: {step:2}  {color.green}loss: {loss:8.5f}  {color.orange}
  grad_norm: {grad_norm:7.4f}  {color.turquoise}memory: {gib:5.2f}GiB({pct:.2f}%)  {color.blue}tps:
  {round(tps):,}  {color.cyan}tflops: {tflops:,.2f}  {color.magenta}mfu: {mfu:.2f}%{color.reset}" and
  f"{color.yellow}validate step: {step:2}  {color.green}loss: {loss:7.4f}  {color.turquoise}memory: ...
  {color.blue}tps: {round(tps):,}{color.reset}", with tools/utils.py Color's ANSI codes, behind
  tools/logging.py's "[titan] %(asctime)s - %(name)s - %(levelname)s - " and torchrun's "[rank0]:" (--tee).
"""

# ruff: noqa: UP032  (the sources' own str.format calls, kept as they are written there)
from __future__ import annotations

import math

# torchtitan/tools/utils.py Color
RED, GREEN, YELLOW, BLUE, MAGENTA, CYAN = (f"\033[{c}m" for c in (31, 32, 33, 34, 35, 36))
RESET = "\033[39m"
ORANGE = "\033[38;2;180;60;0m"
TURQUOISE = "\033[38;2;54;234;195m"


def megatron_iteration(
    iteration: int,
    train_iters: int,
    *,
    global_batch_size: int,
    step_ms: float,
    loss: float,
    tflops: float = 312.4,
    lr: float = 3.0e-4,
    grad_norm: float = 1.234,
) -> str:
    return (
        f" [2026-12-04 10:{iteration // 60 % 60:02d}:{iteration % 60:02d}.{iteration * 997 % 1000000:06d}]"
        + " iteration {:8d}/{:8d} |".format(iteration, train_iters)
        + " consumed samples: {:12d} |".format(iteration * global_batch_size)
        + " elapsed time per iteration (ms): {:.1f} |".format(step_ms)
        + f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
        + f" learning rate: {lr:.6E} |"
        + f" global batch size: {global_batch_size:5d} |"
        + " {}: {:.6E} |".format("lm loss", loss)
        + f" loss scale: {1.0:.1f} |"
        + f" grad norm: {grad_norm:.3f} |"
        + " number of skipped iterations: {:3d} |".format(0)
        + " number of nan iterations: {:3d} |".format(0)
    )


def megatron_validation(prefix: str, loss: float) -> list[str]:
    string = f" validation loss at {prefix} | "
    string += "{} value: {:.6E} | ".format("lm loss", loss)
    string += "{} PPL: {:.6E} | ".format("lm loss", math.exp(min(20, loss)))
    length = len(string) + 1
    return ["-" * length, string, "-" * length]


def primus_iteration(
    iteration: int,
    train_iters: int,
    *,
    global_batch_size: int,
    seq_len: int,
    world_size: int,
    step_ms: float,
    mean_ms: float,
    loss: float,
) -> str:
    tokens = seq_len * global_batch_size / (step_ms / 1000.0) / world_size
    mean_tokens = seq_len * global_batch_size / (mean_ms / 1000.0) / world_size
    log_string = ""
    log_string += " iteration {:8d}/{:8d} |".format(iteration, train_iters)
    log_string += " consumed samples: {:12d} |".format(iteration * global_batch_size)
    log_string += " elapsed time per iteration (ms): {:.1f}/{:.1f} |".format(step_ms, mean_ms)
    log_string += f" hip mem usage/free/total/usage_ratio: {153.81:.2f}GiB/"
    log_string += f"{102.17:.2f}GiB/"
    log_string += f"{255.98:.2f}GiB/{60.09:.2f}% |"
    log_string += f" throughput per GPU (TFLOP/s/GPU): {567.6:.1f}/{568.0:.1f} |"
    log_string += f" tokens per GPU (tokens/s/GPU): {tokens:.1f}/{mean_tokens:.1f} |"
    log_string += " learning rate: {:.6E} |".format(9.984820e-06)
    log_string += " global batch size: {:5d} |".format(global_batch_size)
    log_string += " {}: {:.6E} |".format("lm loss", loss)
    log_string += " loss scale: {:.1f} |".format(1.0)
    log_string += " grad norm: {:.3f} |".format(0.061)
    log_string += " number of skipped iterations: {:3d} |".format(0)
    log_string += " number of nan iterations: {:3d} |".format(0)
    prefix = f"[20261204 09:12:{iteration % 60:02d}][rank-{world_size - 1}/{world_size}][INFO ] "
    return f"{prefix}[--------trainer.py:2560] :{log_string}"


def _titan_prefix(iteration: int) -> str:
    clock = f"10:{iteration // 60 % 60:02d}:{iteration % 60:02d},{iteration % 1000:03d}"
    return f"[rank0]:[titan] 2026-12-04 {clock} - root - INFO - "


def titan_step(step: int, *, loss: float, tps: float, grad_norm: float = 1.2345, tflops: float = 404.37) -> str:
    mfu = 100 * tflops / 989.0
    return _titan_prefix(step) + (
        f"{RED}step: {step:2}  "
        f"{GREEN}loss: {loss:8.5f}  "
        f"{ORANGE}grad_norm: {grad_norm:7.4f}  "
        f"{TURQUOISE}memory: {61.23:5.2f}GiB"
        f"({43.86:.2f}%)  "
        f"{BLUE}tps: {round(tps):,}  "
        f"{CYAN}tflops: {tflops:,.2f}  "
        f"{MAGENTA}mfu: {mfu:.2f}%{RESET}"
    )


def titan_validation(step: int, *, loss: float, tps: float = 30_112.0) -> str:
    return _titan_prefix(step) + (
        f"{YELLOW}validate step: {step:2}  "
        f"{GREEN}loss: {loss:7.4f}  "
        f"{TURQUOISE}memory: {61.23:5.2f}GiB"
        f"({43.86:.2f}%)  "
        f"{BLUE}tps: {round(tps):,}{RESET}"
    )


def loss_at(step: int, seed: int, scale: float = 1.0) -> float:
    """A falling loss with a little noise of its seed (deterministic), times scale (an fp8 penalty)."""
    noise = math.sin(step * 12.9898 + seed * 78.233) * 0.01
    return scale * (3.0 + 7.0 * math.exp(-step / 150) + noise)


def megatron_log(
    num_steps: int, *, seed: int = 0, scale: float = 1.0, step_ms: float = 431.5, eval_every: int = 50, gbs: int = 8
) -> str:
    """A whole Megatron-LM log (--log-interval 1, --eval-interval eval_every, --log-throughput)."""
    lines = [
        "using world size: 8, data-parallel size: 8, context-parallel size: 1",
        "> setting random seeds to 1234 ...",
    ]
    for it in range(1, num_steps + 1):
        ms = step_ms * (9.0 if it == 1 else 1.0 + 0.002 * math.sin(it))  # the first iteration carries start-up
        lines.append(
            megatron_iteration(it, num_steps, global_batch_size=gbs, step_ms=ms, loss=loss_at(it - 1, seed, scale))
        )
        if it % eval_every == 0:
            lines += megatron_validation(f"iteration {it}", loss_at(it - 1, seed + 100, scale) + 0.05)
    lines += megatron_validation(
        f"iteration {num_steps} on validation set", loss_at(num_steps - 1, seed + 100, scale) + 0.05
    )
    lines += megatron_validation(f"iteration {num_steps} on test set", 99.0)
    return "\n".join(lines) + "\n"


def titan_log(num_steps: int, *, seed: int = 0, scale: float = 1.0, tps: float = 9_000.0, eval_every: int = 50) -> str:
    lines = [_titan_prefix(0) + "Training starts at step 1"]
    for step in range(1, num_steps + 1):
        rate = tps / 8 if step == 1 else tps * (1.0 + 0.002 * math.sin(step))
        lines.append(titan_step(step, loss=loss_at(step - 1, seed, scale), tps=rate))
        if step % eval_every == 0:
            lines.append(titan_validation(step, loss=loss_at(step - 1, seed + 100, scale) + 0.05))
    lines.append(_titan_prefix(num_steps) + "Training completed")
    return "\n".join(lines) + "\n"
