"""Efficiency side by side in one run: weight quantisation, speculative decoding, FP8 training,
and what quantisation costs a trained agent's task success.

    python -m bench.efficiency --init_from runs/quickstart/pretrain --out runs/efficiency
    python -m bench.efficiency --init_from runs/quickstart/pretrain --out /tmp/eff --quick
    python -m bench.efficiency --checkpoint runs/quickstart/rl/model --out runs/efficiency_tasks \
        --plot runs/efficiency_tasks/efficiency.png

The first three comparisons use the model of ``--init_from`` (a run directory: ``model/`` and its
``tokenizer.json``), held-out prompts and text cut from the shipped corpus
(``models.calibration.calibration_tokens(split="heldout")``), greedy decoding with EOS off so
that every row generates exactly ``--new_tokens``, and times the fastest of ``--repeats`` calls
after one untimed, compiling call (``bench.decode.best_time``).

* **Weight compression** (``models.compression.compressed_variants``): the model as stored
  (float32), cast to bfloat16, int8 per channel, int4 in groups of ``--group_size`` by
  round-to-nearest and by AWQ, NF4 in absmax blocks of ``--nf4_block``, and 2:4 sparsity by
  magnitude and by Wanda (AWQ and Wanda calibrated on ``--calibration_rows`` rows of the
  training split).  Per variant: the bytes its parameter tree holds
  (``quantization.param_bytes``: codes, scales and zero points; 2:4 rows store their zeros
  densely, a quality row only), decode tokens/s of ``inference.generate`` at
  ``--quant_batch`` rows, perplexity on ``--ppl_rows`` x ``--ppl_len`` held-out tokens
  (``compression.perplexity``) and its increase over float32, and greedy agreement: the share
  of generated tokens equal to float32's at the same position.  The forward dequantises on the
  fly, so on a CPU the smaller formats save memory, not time.
* **Speculative decoding** at batch 1 and ``--spec_batch`` on the same prompts: plain cached
  decoding; a draft model (1 layer of width ``--draft_d_model``, trained here for
  ``--draft_steps`` steps on the same tokenizer) as one chain of 4 drafts and as a tree of 2
  chains x 4 (``inference.speculative_generate``); Medusa (4 heads) and EAGLE (one layer), each
  drafting a dynamic tree (``TreeShape()``: depth 4, 2 children, 12 nodes;
  ``tree_speculative_generate``), trained for ``--head_steps`` steps by the project's trainer
  (``post_training.draft_heads.train_draft_heads``) or loaded from ``--medusa`` / ``--eagle``.
  Acceptance rate (accepted drafts over drafted depth), tokens per target forward, tokens/s and
  speedup over plain decoding, and whether the output equals plain greedy decoding token for
  token (it must: each method is exact).  Every method generates the same number of tokens,
  counted and printed.
* **FP8 training** (``TransformerConfig.matmul_precision="fp8"``, ``models.fp8``) against
  float32 and bfloat16 compute (float32 master weights): the model's shape from one random
  initialisation, ``--train_steps`` AdamW steps in lockstep on the same batches of the shipped
  corpus; median step time and the held-out loss after the last step.  Without an FP8 matrix
  unit (a CPU) the FP8 matmuls are simulated (quantised operands dequantised to float32), so
  the step-time ratio measures the simulation's cost, not FP8's speed; the loss is what FP8's
  rounding costs.
* **Task success** (``--checkpoint``: a trained tool-using model, an SFT or RL run or its
  ``model/``): the same compressed variants of that model (calibrated as above on its own
  tokenizer) play the first ``--problems`` held-out problems of the pipeline config's RL task
  (``rl/TaskSpec`` of ``--gin_file``, default ``quickstart``, with ``--gin_param`` bindings)
  through ``post_training.evaluate_policy``: greedy success, and pass@1 from ``--samples``
  episodes per problem at ``--temperature``.  Every variant plays with the same PRNG key, so
  the sampled episodes share their random numbers (common random numbers: less noise in the
  differences).  Per variant, the paired difference to the float model on the same problems
  and its bootstrap 95% interval, resampled by problem (``eval.bootstrap_ci``, BCa).

``OUT/results.json`` holds every number, ``OUT/report.md`` the tables (also printed), ``--plot``
(default ``docs/efficiency.png``) the figure: memory against perplexity, speculative speedups,
the training losses and the task-success differences.  ``--parts`` runs a subset (by default
every part whose model is given: the first three need ``--init_from``, task success
``--checkpoint``).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np

import agentic_jax.registry  # noqa: F401  (every configurable, before --gin_file is parsed)
from agentic_jax import config as gin_config
from agentic_jax.data.pipeline import train_data
from agentic_jax.eval import bootstrap_ci
from agentic_jax.eval.suites.report import write_files
from agentic_jax.inference import generate, speculative_generate
from agentic_jax.inference.decoding.draft_heads import load_head
from agentic_jax.inference.decoding.draft_tree import TreeShape
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.decoding.tree_speculative import tree_speculative_generate
from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.models.calibration import calibration_tokens
from agentic_jax.models.compression import compressed_variants, perplexity
from agentic_jax.models.export import load_checkpoint
from agentic_jax.models.quantization import param_bytes
from agentic_jax.post_training.draft_heads import train_draft_heads
from agentic_jax.post_training.evaluate import Evaluation, evaluate_policy
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from bench.decode import best_time
from bench.figures import save_figure
from pallas_kernels.benchmarking import describe_device

GAMMA = 4
MEDUSA_HEADS = 4
QUICK = {
    "new_tokens": 8,
    "quant_batch": 2,
    "spec_batch": 4,
    "ppl_rows": 2,
    "ppl_len": 64,
    "calibration_rows": 2,
    "draft_steps": 4,
    "head_steps": 4,
    "train_steps": 3,
    "repeats": 1,
    "problems": 8,
    "samples": 2,
}
INIT_FROM_PARTS = ("compression", "speculation", "fp8")
MODEL_OF = {**dict.fromkeys(INIT_FROM_PARTS, "init_from"), "task_success": "checkpoint"}


def describe(config: TransformerConfig) -> str:
    return (
        f"d={config.d_model}, {config.n_layers} layers, vocab {config.vocab_size}, {config.dtype}"
    )


def greedy(args) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=args.new_tokens)


def compressed_models(params, config, tokenizer, args) -> dict:
    """``{variant: parameters}``: the model as stored (``"float32"``) and its
    ``compressed_variants`` (``--group_size``, ``--nf4_block``), AWQ and Wanda calibrated on
    ``--calibration_rows`` x ``--ppl_len`` tokens of the shipped corpus's training split."""
    calibration = calibration_tokens(
        tokenizer, rows=args.calibration_rows, length=args.ppl_len, split="train"
    )
    variants = compressed_variants(
        params, config, calibration, group_size=args.group_size, nf4_block=args.nf4_block
    )
    return {"float32": variants.pop("float"), **variants}


def compression_rows(params, config, tokenizer, prompts, heldout, args) -> dict[str, dict]:
    """``{variant: row}``: bytes, decode tokens/s, perplexity on ``heldout [B, T]`` and its
    delta, greedy agreement."""
    models = compressed_models(params, config, tokenizer, args)
    bf16 = config.replace(dtype="bfloat16", param_dtype="bfloat16")
    variants = {
        "float32": (models.pop("float32"), config),
        "bfloat16": (jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), bf16),
        **{name: (p, config) for name, p in models.items()},
    }
    key, rows, reference = jax.random.key(0), {}, None
    for name, (p, c) in variants.items():
        seconds, out = best_time(
            generate, p, c, prompts, sampling=greedy(args), key=key, repeats=args.repeats
        )
        tokens = np.asarray(out.tokens)
        reference = tokens if reference is None else reference
        rows[name] = {
            "param_bytes": param_bytes(p),
            "generated_tokens": int(np.sum(out.lengths)),
            "tokens_per_s": int(np.sum(out.lengths)) / seconds,
            "perplexity": perplexity(p, c, heldout),
            "greedy_agreement": float(np.mean(tokens == reference)),
        }
    base = rows["float32"]
    for row in rows.values():
        row["bytes_ratio"] = row["param_bytes"] / base["param_bytes"]
        row["speed_ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["perplexity_delta"] = row["perplexity"] - base["perplexity"]
    return rows


def train_lockstep(configs: dict, tokenizer, args, *, steps: int, seed: int = 0) -> dict:
    """``{name: {"params", "losses", "step_s"}}``: each config from the same initialisation,
    ``steps`` AdamW steps at ``--lr`` on one stream of batches, taking its step on each batch in
    turn (same tokens, same machine load); ``step_s`` the median of the steps after the first."""
    schedule = make_schedule(args.lr, steps, warmup_steps=max(1, steps // 10))
    optimizer = make_optimizer(schedule)
    runs = {}
    for name, config in configs.items():
        params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(seed))
        step = jax.jit(make_train_step(config, optimizer, schedule), donate_argnums=0)
        runs[name] = {"state": TrainState.create(params, optimizer, seed), "step": step}
        runs[name].update(losses=[], times=[])
    batches = iter(
        train_data(
            tokenizer,
            args.files,
            seq_len=args.train_seq_len,
            batch_size=args.train_batch,
            seed=seed,
            prefetch=0,
        )
    )
    for _ in range(steps):
        batch = next(batches)
        for run in runs.values():
            start = time.perf_counter()
            run["state"], metrics = run["step"](run["state"], batch)
            run["losses"].append(float(metrics["loss"]))  # blocks until the step is done
            run["times"].append(time.perf_counter() - start)
    return {
        name: {
            "params": run["state"].params,
            "losses": run["losses"],
            "step_s": float(np.median(run["times"][1:] or run["times"])),
        }
        for name, run in runs.items()
    }


def draft_config(config: TransformerConfig, width: int) -> TransformerConfig:
    """A one-layer model of ``width`` over the target's vocabulary (2 heads, 1 KV head)."""
    return config.replace(
        d_model=width, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=width // 2, d_ff=3 * width
    )


def heads(args, params, config, workdir: str) -> dict:
    """``{"Medusa": head, "EAGLE": head}`` loaded from ``--medusa`` / ``--eagle``, or trained
    for ``--head_steps`` steps by ``train_draft_heads`` under ``workdir``."""
    out = {}
    for name, kind, path in (("Medusa", "medusa", args.medusa), ("EAGLE", "eagle", args.eagle)):
        if path is None:
            path = f"{workdir}/{kind}"
            train_draft_heads(
                path,
                init_from=args.init_from,
                kind=kind,
                num_heads=MEDUSA_HEADS,
                files=args.files,
                steps=args.head_steps,
                batch_size=args.train_batch,
                seq_len=args.train_seq_len,
                warmup_steps=max(1, args.head_steps // 10),
                checkpoint_every=args.head_steps,
                progress=False,
            )
            path = f"{path}/head"
        out[name] = load_head(path, params, config)
    return out


def speculation_rows(params, config, tokenizer, prompts, args) -> dict:
    """``{"setup", "rows": [row per (batch, method)]}`` (module docstring)."""
    start = time.perf_counter()
    small = draft_config(config, args.draft_d_model)
    trained = train_lockstep({"draft": small}, tokenizer, args, steps=args.draft_steps)["draft"]
    with tempfile.TemporaryDirectory() as workdir:
        drafters = heads(args, params, config, workdir)
    setup = {
        "draft_model": f"d={small.d_model}, 1 layer, {args.draft_steps} steps "
        f"(final train loss {trained['losses'][-1]:.2f})",
        "head_steps": None if args.medusa and args.eagle else args.head_steps,
        "drafters_s": time.perf_counter() - start,
        "tree": "depth 4, 2 children per node, 12 nodes",
    }
    draft = {"draft_params": trained["params"], "draft_config": small, "gamma": GAMMA}
    methods = {
        "plain decoding": (generate, {}),
        "draft model, chain of 4": (speculative_generate, draft),
        "draft model, tree 2x4": (speculative_generate, {**draft, "branches": 2}),
        **{
            f"{name}, tree": (tree_speculative_generate, {"head": head, "shape": TreeShape()})
            for name, head in drafters.items()
        },
    }
    key, rows = jax.random.key(0), []
    for batch in sorted({1, args.spec_batch}):
        plain = None
        for name, (fn, kwargs) in methods.items():
            seconds, result = best_time(
                fn,
                params,
                config,
                prompts[:batch],
                sampling=greedy(args),
                key=key,
                repeats=args.repeats,
                **kwargs,
            )
            out = result if fn is generate else result.generation
            plain = plain or (seconds, np.asarray(out.tokens))
            tokens = int(np.sum(out.lengths))
            rows.append(
                {
                    "batch": batch,
                    "method": name,
                    "generated_tokens": tokens,
                    "acceptance_rate": None if fn is generate else result.acceptance_rate,
                    "tokens_per_forward": 1.0 if fn is generate else result.tokens_per_step,
                    "tokens_per_s": tokens / seconds,
                    "speedup": plain[0] / seconds,
                    "same_as_greedy": bool(np.array_equal(np.asarray(out.tokens), plain[1])),
                }
            )
    return {"setup": setup, "rows": rows}


def fp8_training(config, tokenizer, heldout, args) -> dict:
    """float32, bfloat16 compute and FP8 matmuls on the model's shape, trained in lockstep
    (module docstring)."""
    configs = {
        "float32": config,
        "bfloat16": config.replace(dtype="bfloat16"),
        "fp8": config.replace(matmul_precision="fp8"),
    }
    runs = train_lockstep(configs, tokenizer, args, steps=args.train_steps)
    rows = {
        name: {
            "steps": len(run["losses"]),
            "tokens": len(run["losses"]) * args.train_batch * args.train_seq_len,
            "step_s": run["step_s"],
            "train_loss": run["losses"][-1],
            "heldout_loss": math.log(perplexity(run["params"], configs[name], heldout)),
            "losses": run["losses"],
        }
        for name, run in runs.items()
    }
    for name in ("bfloat16", "fp8"):
        rows[name]["step_time_ratio"] = rows[name]["step_s"] / rows["float32"]["step_s"]
    return rows


def pipeline_tasks(gin_files: list[str], gin_params: list[str]) -> TaskSpec:
    """The RL stage's problems of a pipeline config: ``rl/TaskSpec`` after parsing
    ``gin_files`` and ``gin_params`` (gin is cleared again afterwards)."""
    gin_config.parse(gin_files, gin_params)
    try:
        with gin.config_scope("rl"):
            return TaskSpec()
    finally:
        gin.clear_config()


def paired_deltas(evaluations: dict[str, Evaluation], *, seed: int = 0) -> dict[str, dict]:
    """``{variant: row}`` for evaluations of the same problems, the first the reference: greedy
    success and pass@1 (successes over samples, per problem), their per-problem lists, and
    each one's paired difference to the reference with its bootstrap 95% interval
    (``bootstrap_ci(paired_with=...)``: problems resampled, both variants' outcomes together)."""
    base = next(iter(evaluations.values()))

    def per_problem(e: Evaluation) -> dict[str, np.ndarray]:
        return {"success": e.success.astype(float), "pass@1": e.sampled_correct / e.samples}

    reference = per_problem(base)
    rows = {}
    for name, evaluation in evaluations.items():
        if evaluation.success.shape != base.success.shape:
            raise ValueError(
                f"paired_deltas: {name!r} played {evaluation.success.size} problems, the "
                f"reference {base.success.size}"
            )
        row = {"tool_calls": float(evaluation.tool_calls.mean())}
        for metric, values in per_problem(evaluation).items():
            delta, low, high = bootstrap_ci(values, paired_with=reference[metric], seed=seed)
            row |= {
                metric: float(values.mean()),
                f"{metric}_delta": delta,
                f"{metric}_ci95": [low, high],
                f"per_problem_{metric}": values.tolist(),
            }
        rows[name] = row
    return rows


def task_success_rows(tasks: TaskSpec, args) -> dict:
    """``{"setup", "rows"}``: every compressed variant of ``--checkpoint``'s model on the first
    ``--problems`` held-out problems of ``tasks`` (module docstring), rows as
    :func:`paired_deltas`."""
    config, params, tokenizer = load_checkpoint(args.checkpoint)
    env = tasks.env(tokenizer, "heldout")
    problems = np.arange(min(args.problems, np.shape(env.default_params.task_weights)[0]))
    if problems.size < 2:
        raise ValueError(f"task success needs at least 2 held-out problems, got {problems.size}")
    key = jax.random.key(args.seed)
    evaluations = {
        name: evaluate_policy(
            p,
            config,
            env,
            samples=args.samples,
            temperature=args.temperature,
            key=key,  # the same for every variant: common random numbers
            batch_rows=args.eval_rows,
            tasks=problems,
        )
        for name, p in compressed_models(params, config, tokenizer, args).items()
    }
    generators = ", ".join(f"{g.family}/{g.difficulty}" for g in tasks.generators)
    setup = {"problems": int(problems.size), "tasks": generators, "model": describe(config)}
    return {"setup": setup, "rows": paired_deltas(evaluations, seed=args.seed)}


def _compression_report(s: dict, quant: dict) -> list[str]:
    lines = [
        f"**Weight compression** ({s['quant_batch']} rows, {s['quant_batch'] * s['new_tokens']} "
        f"tokens per variant; perplexity on {s['ppl_rows']} x {s['ppl_len']} held-out tokens; "
        f"int4 groups of {s['group_size']}, NF4 blocks of {s['nf4_block']}; 2:4 rows store their "
        "zeros densely: quality only):",
        "",
        "| variant | param bytes | vs float32 | decode tok/s | vs float32 | perplexity | Δ | "
        "greedy agreement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in quant.items():
        lines.append(
            f"| {name} | {r['param_bytes']:,} | {r['bytes_ratio']:.2f}x | "
            f"{r['tokens_per_s']:.0f} | {r['speed_ratio']:.2f}x | {r['perplexity']:.2f} | "
            f"{r['perplexity_delta']:+.2f} | {r['greedy_agreement']:.3f} |"
        )
    return lines


def _speculation_report(s: dict, spec: dict) -> list[str]:
    ss = spec["setup"]
    heads = (
        "loaded from --medusa / --eagle"
        if ss["head_steps"] is None
        else f"trained {ss['head_steps']} steps each"
    )
    lines = [
        f"**Speculative decoding** (draft model {ss['draft_model']}; Medusa ({MEDUSA_HEADS} "
        f"heads) and EAGLE {heads}; trees of {ss['tree']}; drafters ready in "
        f"{ss['drafters_s']:.0f} s):",
        "",
        "| batch | method | tokens | acceptance | tokens / target forward | tok/s | speedup | "
        "same as greedy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in spec["rows"]:
        accept = "" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        lines.append(
            f"| {r['batch']} | {r['method']} | {r['generated_tokens']} | {accept} | "
            f"{r['tokens_per_forward']:.2f} | {r['tokens_per_s']:.0f} | {r['speedup']:.2f}x | "
            f"{'yes' if r['same_as_greedy'] else 'NO'} |"
        )
    return lines


def _fp8_report(s: dict, train: dict) -> list[str]:
    f32 = train["float32"]
    lines = [
        f"**FP8 training** ({f32['steps']} steps x {s['train_batch']} x {s['train_seq_len']} "
        f"tokens, the same batches, from one initialisation; held-out loss in nats/token on the "
        f"perplexity tokens above):",
        "",
        "| matmuls | steps | tokens | median step s | ratio | train loss | held-out loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in train.items():
        ratio = r.get("step_time_ratio", 1.0)
        lines.append(
            f"| {name} | {r['steps']} | {r['tokens']:,} | {r['step_s']:.3f} | {ratio:.2f}x | "
            f"{r['train_loss']:.3f} | {r['heldout_loss']:.3f} |"
        )
    if not s["fp8_dot"]:
        lines += [
            "",
            f"No FP8 matrix unit on {s['device']}: the FP8 matmuls are simulated (quantised "
            "operands dequantised to float32), so the step-time ratio is the simulation's cost, "
            "not FP8's speed.",
        ]
    return lines


def _task_success_report(s: dict, tasks: dict) -> list[str]:
    ts = tasks["setup"]
    lines = [
        f"**Task success** (model `{s['checkpoint']}`, {ts['model']}; the first "
        f"{ts['problems']} held-out problems of {ts['tasks']}; greedy success, and pass@1 from "
        f"{s['samples']} samples per problem at temperature {s['temperature']}; Δ: the paired "
        "difference to float32 on the same problems, bootstrap 95% interval over problems):",
        "",
        "| variant | greedy success | Δ (95% CI) | pass@1 | Δ (95% CI) | tool calls / episode |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in tasks["rows"].items():
        delta = {
            m: f"{r[f'{m}_delta']:+.3f} [{r[f'{m}_ci95'][0]:+.3f}, {r[f'{m}_ci95'][1]:+.3f}]"
            for m in ("success", "pass@1")
        }
        lines.append(
            f"| {name} | {r['success']:.3f} | {delta['success']} | {r['pass@1']:.3f} | "
            f"{delta['pass@1']} | {r['tool_calls']:.2f} |"
        )
    return lines


REPORTS = {
    "compression": _compression_report,
    "speculation": _speculation_report,
    "fp8": _fp8_report,
    "task_success": _task_success_report,
}


def report(results: dict) -> str:
    """The comparisons that ran, as Markdown tables, each with its budget."""
    s = results["setup"]
    lines = [f"On {s['device']}."]
    if any(name in results for name in INIT_FROM_PARTS):
        lines = [
            f"Model `{s['init_from']}` ({s['model']}) on {s['device']}; greedy decoding of "
            f"{s['new_tokens']} new tokens after {s['prompt_len']}-token held-out prompts, EOS "
            f"off, fastest of {s['repeats']} timed calls after a compiling one.",
        ]
    for name, part in REPORTS.items():
        if name in results:
            lines += ["", *part(s, results[name])]
    return "\n".join(lines)


def _plot_compression(ax, quant: dict) -> None:
    for name, r in quant.items():
        ax.scatter(r["param_bytes"] / 2**20, r["perplexity"])
        ax.annotate(name, (r["param_bytes"] / 2**20, r["perplexity"]), fontsize=8)
    ax.set(xlabel="parameter MiB", ylabel="held-out perplexity", title="weight compression")


def _plot_speculation(ax, spec: dict) -> None:
    rows = [r for r in spec["rows"] if r["method"] != "plain decoding"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    width = 0.8 / len(batches)
    for i, batch in enumerate(batches):
        speedups = [
            next(r["speedup"] for r in rows if (r["batch"], r["method"]) == (batch, m))
            for m in methods
        ]
        ax.bar(np.arange(len(methods)) + i * width, speedups, width, label=f"batch {batch}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(np.arange(len(methods)) + width / 2, methods, rotation=20, fontsize=7)
    ax.set(ylabel="speedup over plain decoding", title="speculative decoding")
    ax.legend(fontsize=8)


def _plot_fp8(ax, train: dict) -> None:
    for name, r in train.items():
        ax.plot(np.arange(1, r["steps"] + 1), r["losses"], label=name)
    ax.set(
        xlabel="step", ylabel="train loss (nats/token)", title="FP8 vs bfloat16 vs float32 training"
    )
    ax.legend(fontsize=8)


def _plot_task_success(ax, tasks: dict) -> None:
    names = [n for n in tasks["rows"] if n != "float32"]
    width = 0.4
    for i, metric in enumerate(("success", "pass@1")):
        rows = [tasks["rows"][n] for n in names]
        deltas = np.array([r[f"{metric}_delta"] for r in rows])
        ci = np.array([r[f"{metric}_ci95"] for r in rows]).reshape(-1, 2)
        error = np.stack([deltas - ci[:, 0], ci[:, 1] - deltas])
        label = "greedy success" if metric == "success" else metric
        ax.bar(np.arange(len(names)) + i * width, deltas, width, yerr=error, label=label)
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xticks(np.arange(len(names)) + width / 2, names, rotation=20, fontsize=7)
    ax.set(ylabel="difference to float32 (95% CI)", title="held-out task success")
    ax.legend(fontsize=8)


PLOTS = {
    "compression": _plot_compression,
    "speculation": _plot_speculation,
    "fp8": _plot_fp8,
    "task_success": _plot_task_success,
}


def plot(results: dict, path: str) -> None:
    """One panel per comparison that ran: memory against perplexity per variant, speculative
    speedups, the training losses, the task-success differences."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [name for name in PLOTS if name in results]
    fig, axes = plt.subplots(1, len(ran), figsize=(5 * len(ran), 4), squeeze=False)
    for name, ax in zip(ran, axes[0]):
        PLOTS[name](ax, results[name])
        ax.grid(alpha=0.3)
    save_figure(fig, path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--init_from", help="a run directory (model/, tokenizer): parts 1-3")
    parser.add_argument("--checkpoint", help="a trained agent (run or model/): task success")
    parser.add_argument("--out", required=True, help="results.json and report.md")
    parser.add_argument("--plot", default="docs/efficiency.png")
    parser.add_argument("--quick", action="store_true", help="tiny budgets, a smoke run")
    parser.add_argument(
        "--parts", nargs="+", choices=list(REPORTS), help="what to compare (default: all given)"
    )
    parser.add_argument("--files", nargs="+", help="training text (default: the shipped corpus)")
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls, the fastest counts")
    parser.add_argument("--quant_batch", type=int, default=8)
    parser.add_argument("--group_size", type=int, default=32, help="int4's (AWQ too)")
    parser.add_argument(
        "--nf4_block",
        type=int,
        default=32,
        help="NF4's absmax block (QLoRA: 64; d_ff=352 needs 32)",
    )
    parser.add_argument("--ppl_rows", type=int, default=16)
    parser.add_argument("--ppl_len", type=int, default=256)
    parser.add_argument("--calibration_rows", type=int, default=8)
    parser.add_argument("--spec_batch", type=int, default=16)
    parser.add_argument("--draft_d_model", type=int, default=64)
    parser.add_argument("--draft_steps", type=int, default=200)
    parser.add_argument("--head_steps", type=int, default=150)
    parser.add_argument("--medusa", help="a trained Medusa head (skips its training)")
    parser.add_argument("--eagle", help="a trained EAGLE head (skips its training)")
    parser.add_argument("--train_steps", type=int, default=40, help="FP8 vs float32")
    parser.add_argument("--train_batch", type=int, default=8)
    parser.add_argument("--train_seq_len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--gin_file",
        nargs="+",
        default=["quickstart"],
        help="the pipeline config (its rl/TaskSpec)",
    )
    parser.add_argument("--gin_param", action="append", default=[], help="a binding; repeatable")
    parser.add_argument("--problems", type=int, default=200, help="held-out problems (the first)")
    parser.add_argument("--samples", type=int, default=4, help="episodes per problem for pass@1")
    parser.add_argument("--temperature", type=float, default=1.0, help="of the sampled episodes")
    parser.add_argument("--eval_rows", type=int, default=64, help="episodes decoded together")
    parser.add_argument("--seed", type=int, default=0, help="episodes' key, bootstrap's seed")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, min(getattr(args, name), value))
    if args.parts is None:
        args.parts = [name for name in REPORTS if getattr(args, MODEL_OF[name])]
    if not args.parts:
        parser.error(
            "give --init_from (compression, speculation, fp8), --checkpoint (task_success)"
        )
    for name in args.parts:
        if getattr(args, MODEL_OF[name]) is None:
            parser.error(f"--parts {name} needs --{MODEL_OF[name]}")
    if args.samples < 1:
        parser.error(f"--samples must be at least 1 (pass@1), got {args.samples}")

    device = describe_device()
    print(device, flush=True)
    results = {
        "setup": {
            **vars(args),
            "device": device,
            "fp8_dot": jax.default_backend() == "gpu",  # as models.fp8 decides
        },
    }
    parts = {}
    if "task_success" in args.parts:  # the config first: a bad binding fails before any work
        tasks = pipeline_tasks(args.gin_file, args.gin_param)
        parts["task_success"] = lambda: task_success_rows(tasks, args)
    if set(args.parts) & set(INIT_FROM_PARTS):
        config, params, tokenizer = load_checkpoint(args.init_from)
        rows = max(args.quant_batch, args.spec_batch)
        prompts = jnp.asarray(
            calibration_tokens(tokenizer, rows=rows, length=args.prompt_len, split="heldout")
        )
        heldout = calibration_tokens(
            tokenizer, rows=args.ppl_rows, length=args.ppl_len, split="heldout"
        )
        results["setup"]["model"] = describe(config)
        parts |= {
            "compression": lambda: compression_rows(
                params, config, tokenizer, prompts[: args.quant_batch], heldout, args
            ),
            "speculation": lambda: speculation_rows(params, config, tokenizer, prompts, args),
            "fp8": lambda: fp8_training(config, tokenizer, heldout, args),
        }
    for name in args.parts:
        part = parts[name]
        start = time.perf_counter()
        results[name] = part()
        results["setup"][f"{name}_s"] = time.perf_counter() - start
        print(f"{name}: {results['setup'][f'{name}_s']:.0f} s", flush=True)
    text = report(results)
    write_files(args.out, results, text + "\n", {})
    plot(results, args.plot)
    print(text)
    return results


if __name__ == "__main__":
    main()
