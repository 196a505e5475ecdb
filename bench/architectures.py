"""Model architectures side by side: dense vs mixture of experts at equal active parameters,
Muon vs AdamW at equal steps, multi-head latent attention (MLA) vs grouped-query attention (GQA).

    python -m bench.architectures --out runs/architectures

Every training run learns from the same batches of the shipped corpus
(``data.pipeline.train_data``, a byte-level BPE of ``--vocab_size`` trained on it first) through
the project's train step (``training.make_train_step``, jitted and compiled before any clock
starts).  The runs go in lockstep: each batch is drawn once and every run takes its step on it in
turn, so compared runs see the same tokens in the same order and the same machine load (on a
shared machine, other jobs' bursts hit every run alike).  A run's throughput is its target tokens
per step over its *median* step time (a burst lands on a few steps, the median ignores them); its
held-out loss is the next-token NLL in nats per token (an MoE's router losses left out) over the
whole held-out split (``training.loop.evaluate``), with curves on the split's first
``--eval_batches`` batches every ``--eval_every`` steps.  Schedules: linear warmup over a tenth of
the steps, then cosine decay to a tenth of the peak.

* **Dense vs MoE**: the dense model (``--d_model``, ``--n_layers``, ``--d_ff``, ...) and its MoE
  twin, every MLP ``--experts`` SwiGLU experts of which ``--experts_per_token`` run per token,
  the expert width chosen so that ``models.param_count(active=True)`` is as close to the dense
  count as a width can make it; both AdamW at ``--lr``.
* **Muon vs AdamW**: the dense model with ``make_optimizer(kind="adamw")`` at each peak
  learning rate of ``--adamw_lrs`` (``--lr`` is always one: that run is also the dense run
  above) and ``kind="muon"`` (Muon on the hidden matrices, AdamW on the rest) at each of
  ``--muon_lrs``; each optimiser's best held-out loss at equal steps, with a note when the best
  is at the edge of its grid (the grid should then be widened).
* **MLA vs GQA**: random-weight models of the same ``d_model`` and query heads, GQA with
  ``--n_kv_heads`` heads of ``--head_dim``, MLA (DeepSeek-V2) with a ``--kv_lora_rank`` latent and
  a ``--qk_rope_head_dim`` shared rope key (per-head query/key and value widths ``--head_dim``,
  full-rank queries): KV-cache bytes per token, summed over the arrays the
  decoder's cache (``kv_cache.init_cache``) allocates, and greedy decode tokens/s of
  ``inference.generate`` (best of 3 after a compiling call, EOS off so every row decodes
  ``--new_tokens``).  Skipped, with the reason printed, while the model or its decoder has no
  MLA (no ``attention_type`` field, or a cache that is not the latent).

``OUT/results.json`` holds every run (its budget, curve, throughput and loss) and the ratios;
``OUT/report.md`` the tables (also printed); ``--plot`` (default ``docs/architectures.png``) the
held-out loss curves of both training comparisons.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import tempfile
import time

import jax
import numpy as np

from agentic_jax.data.pipeline import heldout_data, train_data
from agentic_jax.data.tokenizer import train_tokenizer
from agentic_jax.eval.suites.report import write_files
from agentic_jax.inference import generate
from agentic_jax.inference.decoding.kv_cache import init_cache
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig, init_params, param_count
from agentic_jax.training import (
    TrainState,
    make_eval_step,
    make_optimizer,
    make_schedule,
    make_train_step,
)
from agentic_jax.training.loop import evaluate
from bench.decode import best_time

DENSE, MOE = "dense", "MoE"
# The dense model's shape (flags of these names); GQA in the MLA comparison.
SHAPE = dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=352)


@dataclasses.dataclass
class Run:
    """One model and optimiser, trained in lockstep with the others."""

    model: str  # DENSE or MOE
    config: TransformerConfig
    optimizer: str
    lr: float
    step: object = None  # the compiled train step
    state: TrainState | None = None
    seconds: list[float] = dataclasses.field(default_factory=list)
    tokens: int = 0
    curve: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    heldout_loss: float = math.nan

    @property
    def name(self) -> str:
        return f"{self.model} {self.optimizer} lr={self.lr:g}"

    def compile(self, batch, steps: int, seed: int) -> None:
        schedule = make_schedule(self.lr, steps, warmup_steps=max(1, steps // 10))
        optimizer = make_optimizer(schedule, kind=self.optimizer)
        # One compiled program, not an op-by-op optimiser init (a compile per small op).
        create = jax.jit(
            lambda key: TrainState.create(init_params(self.config, key), optimizer, seed)
        )
        self.state = create(jax.random.key(seed))
        step = jax.jit(make_train_step(self.config, optimizer, schedule), donate_argnums=0)
        self.step = step.lower(self.state, batch).compile()

    def train_step(self, batch) -> None:
        start = time.perf_counter()
        self.state, metrics = self.step(self.state, batch)
        self.tokens += int(metrics["tokens"])  # waits for the step
        self.seconds.append(time.perf_counter() - start)

    def summary(self, batch_size: int) -> dict:
        steps = len(self.seconds)
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "lr": self.lr,
            "steps": steps,
            "samples": steps * batch_size,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / steps / float(np.median(self.seconds)),
            "heldout_loss": self.heldout_loss,
            "curve": self.curve,
            "total_params": param_count(self.config),
            "active_params": param_count(self.config, active=True),
            "moe_d_ff": self.config.expert_d_ff if self.config.n_experts else None,
        }


def matched_moe(dense: TransformerConfig, experts: int, k: int) -> TransformerConfig:
    """The MoE twin of ``dense`` whose active parameters come closest to the dense count: ``k``
    experts of width ``f`` replace the MLP of width ``d_ff``, so ``f`` is near ``d_ff / k``
    (a little under, the router's ``D x E`` weights being active too)."""
    target = param_count(dense)
    around = dense.d_ff // k
    return min(
        (
            dense.replace(n_experts=experts, experts_per_token=k, moe_d_ff=f)
            for f in range(max(1, around - 8), around + 9)
        ),
        key=lambda config: abs(param_count(config, active=True) - target),
    )


@functools.cache
def _eval_step(config: TransformerConfig):
    """One jitted eval step (the next-token NLL alone) per model, shared by all its runs."""
    return jax.jit(make_eval_step(config))


def train_lockstep(runs: list[Run], args, tokenizer, cache_dir: str) -> dict:
    """Trains every run for ``args.steps`` steps on one stream of batches; returns the held-out
    split's size and unigram entropy (the loss of the best context-free model)."""
    shape = dict(seq_len=args.seq_len, batch_size=args.batch_size, cache_dir=cache_dir)
    batches = iter(train_data(tokenizer, seed=args.seed, **shape))
    heldout = heldout_data(tokenizer, **shape)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    first = next(batches)
    start = time.perf_counter()
    for run in runs:
        run.compile(first, args.steps, args.seed)
    print(f"compiled {len(runs)} train steps in {time.perf_counter() - start:.0f} s", flush=True)

    def held_out(run, max_batches):
        params = run.state.params
        vocab = run.config.vocab_size
        return evaluate(_eval_step(run.config), params, heldout, device, vocab, max_batches)

    start = time.perf_counter()
    for step, batch in zip(range(1, args.steps + 1), itertools.chain([first], batches)):
        for run in runs:
            run.train_step(batch)
        if step % args.eval_every == 0 or step == args.steps:
            for run in runs:
                run.curve.append((step, held_out(run, args.eval_batches)["eval_loss"]))
            losses = "  ".join(f"{run.name} {run.curve[-1][1]:.3f}" for run in runs)
            print(f"step {step} ({time.perf_counter() - start:.0f} s): {losses}", flush=True)
    for run in runs:
        final = held_out(run, args.final_eval_batches)
        run.heldout_loss = final["eval_loss"]
    return {
        "heldout_tokens": final["eval_tokens"],
        "heldout_unigram_entropy": final["heldout_unigram_entropy"],
    }


def cache_bytes_per_token(config: TransformerConfig) -> int:
    """Bytes the decoder's KV cache allocates per token, all layers (its arrays' shapes, not a
    formula, so the figure is what decoding really holds)."""
    cache = jax.eval_shape(functools.partial(init_cache, config, 1, 1))
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(cache))


def mla_vs_gqa(gqa: TransformerConfig, args) -> dict:
    """KV-cache bytes per token and decode tokens/s of GQA and MLA at one ``d_model`` and head
    count, or ``{"skipped": why}`` while the model or its decoder has no MLA."""
    if "attention_type" not in {field.name for field in dataclasses.fields(TransformerConfig)}:
        return {"skipped": "TransformerConfig has no attention_type: MLA has not landed"}
    mla = gqa.replace(
        attention_type="mla",
        kv_lora_rank=args.kv_lora_rank,
        qk_nope_head_dim=gqa.head_dim,
        qk_rope_head_dim=args.qk_rope_head_dim,
        v_head_dim=gqa.head_dim,
    )
    latent = mla.kv_cache_width * mla.n_layers * mla.compute_dtype.itemsize
    if cache_bytes_per_token(mla) != latent:
        return {
            "skipped": f"the decoder's cache for MLA holds {cache_bytes_per_token(mla)} bytes per "
            f"token, not the latent's {latent}: MLA decoding has not landed"
        }
    prompt = jax.random.randint(
        jax.random.key(1), (args.decode_batch, args.prompt_len), 0, gqa.vocab_size
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=args.new_tokens)
    rows = {}
    for name, config in (("GQA", gqa), ("MLA", mla)):
        params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(args.seed))
        seconds, _ = best_time(
            generate, params, config, prompt, sampling=greedy, key=jax.random.key(0)
        )
        rows[name] = {
            "cache_width": config.kv_cache_width,
            "cache_bytes_per_token": cache_bytes_per_token(config),
            "params": param_count(config),
            "decode_tokens_per_s": args.decode_batch * args.new_tokens / seconds,
        }
        print(f"{name}: {rows[name]}", flush=True)
    return {
        "rows": rows,
        "ratios": {key: rows["MLA"][key] / rows["GQA"][key] for key in rows["GQA"]},
        "budget": {
            "batch": args.decode_batch,
            "prompt_tokens": args.prompt_len,
            "new_tokens": args.new_tokens,
        },
    }


def compare(runs: list[Run], args) -> dict:
    """The two training comparisons' runs, best choices and ratios."""
    summaries = {run.name: run.summary(args.batch_size) for run in runs}
    dense = next(
        r.name for r in runs if r.model == DENSE and r.optimizer == "adamw" and r.lr == args.lr
    )
    moe = next(r.name for r in runs if r.model == MOE)
    ratios = {
        key: summaries[moe][key] / summaries[dense][key]
        for key in ("total_params", "active_params", "tokens", "tokens_per_s", "heldout_loss")
    }
    best = {
        kind: min(
            (r.name for r in runs if r.model == DENSE and r.optimizer == kind),
            key=lambda name: summaries[name]["heldout_loss"],
        )
        for kind in ("adamw", "muon")
    }
    muon, adamw = summaries[best["muon"]], summaries[best["adamw"]]
    grids = {"adamw": args.adamw_lrs, "muon": args.muon_lrs}
    at_edge = [
        kind
        for kind, grid in grids.items()
        if len(grid) > 1 and summaries[best[kind]]["lr"] in (grid[0], grid[-1])
    ]
    return {
        "runs": summaries,
        "dense_vs_moe": {"dense": dense, "moe": moe, "ratios": ratios},
        "muon_vs_adamw": {
            "best": best,
            "ratios": {key: muon[key] / adamw[key] for key in ("heldout_loss", "tokens_per_s")},
            "loss_difference": muon["heldout_loss"] - adamw["heldout_loss"],
            "best_at_grid_edge": at_edge,
        },
    }


def _count(n: float) -> str:
    return f"{n:,.0f}"


def report(results: dict) -> str:
    """The three comparisons as Markdown tables, each with its budget."""
    setup, runs = results["setup"], results["runs"]
    moe_vs = results["dense_vs_moe"]
    dense, moe = runs[moe_vs["dense"]], runs[moe_vs["moe"]]
    lines = [
        f"Budget of every training run: {dense['steps']} steps x {setup['batch_size']} rows x "
        f"{setup['seq_len']} tokens = {_count(dense['tokens'])} target tokens "
        f"({dense['samples']} samples), the same batches of the shipped corpus, {len(runs)} runs "
        f"in lockstep on {setup['device']}. Held-out loss in nats/token over all "
        f"{_count(setup['heldout_tokens'])} held-out tokens (unigram entropy "
        f"{setup['heldout_unigram_entropy']:.3f}); tokens/s from the median step.",
        "",
        f"Dense vs MoE at equal active parameters (d={setup['d_model']}, {setup['n_layers']} "
        f"layers; AdamW, peak lr {setup['lr']:g}):",
        "",
        "| model | total params | active params | tokens | tokens/s | held-out loss |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    labels = {
        moe_vs["dense"]: f"dense (d_ff {setup['d_ff']})",
        moe_vs["moe"]: f"MoE, {setup['experts']} experts, top-{setup['experts_per_token']} "
        f"(width {moe['moe_d_ff']})",
    }
    for name, label in labels.items():
        run = runs[name]
        lines.append(
            f"| {label} | {_count(run['total_params'])} | {_count(run['active_params'])} | "
            f"{_count(run['tokens'])} | {_count(run['tokens_per_s'])} | "
            f"{run['heldout_loss']:.3f} |"
        )
    r = moe_vs["ratios"]
    lines += [
        f"| MoE / dense | {r['total_params']:.2f}x | {r['active_params']:.3f}x | "
        f"{r['tokens']:.2f}x | {r['tokens_per_s']:.2f}x | {r['heldout_loss']:.3f}x |",
        "",
        f"Muon vs AdamW on the dense model at equal steps (peak lr sweeps: AdamW "
        f"{setup['adamw_lrs']}, Muon {setup['muon_lrs']}; one run of the budget above each):",
        "",
        "| optimiser | peak lr | steps | tokens | tokens/s | held-out loss |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    muon_vs = results["muon_vs_adamw"]
    for name, run in runs.items():
        if run["model"] != DENSE:
            continue
        loss = f"{run['heldout_loss']:.3f}"
        if name in muon_vs["best"].values():
            loss = f"**{loss}**"
        lines.append(
            f"| {run['optimizer']} | {run['lr']:g} | {run['steps']} | {_count(run['tokens'])} | "
            f"{_count(run['tokens_per_s'])} | {loss} |"
        )
    r = muon_vs["ratios"]
    lines += [
        "",
        f"Best Muon / best AdamW held-out loss: {r['heldout_loss']:.3f}x "
        f"({muon_vs['loss_difference']:+.3f} nats); tokens/s {r['tokens_per_s']:.2f}x."
        + "".join(
            f" The best {kind} rate is at the edge of its grid: a wider sweep may do better."
            for kind in muon_vs["best_at_grid_edge"]
        ),
        "",
    ]
    mla = results["mla_vs_gqa"]
    if "skipped" in mla:
        return "\n".join([*lines, f"MLA vs GQA: skipped ({mla['skipped']})."])
    budget, rows = mla["budget"], mla["rows"]
    lines += [
        f"MLA vs GQA (d={setup['d_model']}, {setup['n_heads']} query heads, "
        f"{setup['n_layers']} layers, random weights; greedy decoding of {budget['new_tokens']} "
        f"tokens after {budget['prompt_tokens']}-token prompts, batch {budget['batch']}):",
        "",
        "| attention | cached values / token / layer | KV-cache bytes / token | params | "
        "decode tokens/s |",
        "|---|---:|---:|---:|---:|",
        f"| GQA ({setup['n_kv_heads']} KV heads x {setup['head_dim']}) | "
        + " | ".join(_count(v) for v in rows["GQA"].values())
        + " |",
        f"| MLA (latent {setup['kv_lora_rank']} + rope key {setup['qk_rope_head_dim']}) | "
        + " | ".join(_count(v) for v in rows["MLA"].values())
        + " |",
        "| MLA / GQA | " + " | ".join(f"{v:.2f}x" for v in mla["ratios"].values()) + " |",
    ]
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """Held-out loss curves: dense vs MoE (left), every Muon and AdamW run (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for key in ("dense", "moe"):
        name = results["dense_vs_moe"][key]
        steps, losses = zip(*runs[name]["curve"])
        left.plot(
            steps, losses, marker="o", label=f"{name} ({runs[name]['active_params']:,} active)"
        )
    for name, run in runs.items():
        if run["model"] == DENSE:
            steps, losses = zip(*run["curve"])
            style = "-" if run["optimizer"] == "muon" else "--"
            right.plot(steps, losses, style, marker="o", label=name)
    tokens = results["setup"]["batch_size"] * results["setup"]["seq_len"]
    for ax, title in ((left, "dense vs MoE, equal active parameters"), (right, "Muon vs AdamW")):
        ax.set_title(title)
        ax.set_xlabel(f"step ({tokens:,} token slots each)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    left.set_ylabel("held-out loss (nats/token)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="results.json and report.md")
    parser.add_argument("--plot", default="docs/architectures.png")
    parser.add_argument("--vocab_size", type=int, default=1024)
    for name, default in SHAPE.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--experts_per_token", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3, help="dense vs MoE's peak lr")
    parser.add_argument("--adamw_lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--muon_lrs", type=float, nargs="+", default=[3e-3, 1e-2, 3e-2])
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--eval_batches", type=int, default=4, help="the curves' held-out batches")
    parser.add_argument(
        "--final_eval_batches", type=int, default=0, help="the final loss's (0: all of them)"
    )
    parser.add_argument("--kv_lora_rank", type=int, default=64)
    parser.add_argument("--qk_rope_head_dim", type=int, default=16)
    parser.add_argument("--decode_batch", type=int, default=8)
    parser.add_argument("--prompt_len", type=int, default=16)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.adamw_lrs = sorted({*args.adamw_lrs, args.lr})
    args.muon_lrs = sorted(set(args.muon_lrs))

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = train_tokenizer(f"{tmp}/tokenizer.json", vocab_size=args.vocab_size)
        dense = TransformerConfig(
            vocab_size=tokenizer.vocab_size,
            max_seq_len=max(args.seq_len, args.prompt_len + args.new_tokens),
            **{name: getattr(args, name) for name in SHAPE},
        )
        moe = matched_moe(dense, args.experts, args.experts_per_token)
        runs = [Run(DENSE, dense, "adamw", lr) for lr in args.adamw_lrs]
        runs += [Run(DENSE, dense, "muon", lr) for lr in args.muon_lrs]
        runs.append(Run(MOE, moe, "adamw", args.lr))
        print(
            f"budget of every training run: {args.steps} steps x {args.batch_size} rows x "
            f"{args.seq_len} tokens, the same batches for all {len(runs)} runs\n"
            f"dense: {param_count(dense):,} parameters (all active); MoE: "
            f"{param_count(moe):,} total, {param_count(moe, active=True):,} active "
            f"(expert width {moe.expert_d_ff})",
            flush=True,
        )
        heldout = train_lockstep(runs, args, tokenizer, tmp)
    results = {
        "setup": {**vars(args), **heldout, "device": jax.devices()[0].device_kind},
        **compare(runs, args),
        "mla_vs_gqa": mla_vs_gqa(dense, args),
    }
    text = report(results)
    write_files(args.out, results, text + "\n", {})
    plot(results, args.plot)
    print(text)
    return results


if __name__ == "__main__":
    main()
