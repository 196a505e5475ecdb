"""The OpenAI-compatible server under load: the Starlette + uvicorn server of this checkout beside
the standard library's ThreadingHTTPServer it replaced, in the same run.

    python -m bench.serving --out runs/serving_bench
    python -m bench.serving --out /tmp/serving --init_from runs/quickstart/pretrain --baseline none

Each server runs as ``python -m agentic_jax serve`` in a subprocess of its own, on the same
checkpoint and the same engine settings (``--num_slots``, through ``--gin_param``): this
checkout's (``PYTHONPATH`` at its root) and, unless ``--baseline none``, the code of commit
``--baseline`` (default ``fbce723``, the last with the old server), written out of git history
by ``git archive`` into a temporary directory with its own ``PYTHONPATH``.  The checkpoint is
``--init_from`` (a run directory: ``model/`` and its ``tokenizer.json``) or a random model made
here (``TINY``, a byte-level BPE of the shipped corpus) whose special tokens have zero logits,
so that greedy decoding never ends a reply early.

``--clients`` concurrent clients (asyncio, httpx) each send one streaming chat completion after
another, greedy, with ``stream_options.include_usage``: a user turn of ``--prompt_words`` words
cut from the shipped held-out corpus at a random place, and ``max_tokens`` of ``--max_tokens``,
each drawn per request (the same draws for both servers: each client's generator is seeded by
``--seed`` and its index).  A warm-up (at least ``--warmup_s``, and until every prompt length
has been answered once, so that the engine's shapes are compiled) comes first and is not counted;
then clients start requests for ``--duration_s`` seconds, and the requests in flight at the end
finish and count.  Per server: requests and tokens (the usage each reply reports), output
tokens/s and requests/s over the measured time (from its start to the last reply's end), time to
first token (from sending the request to the first chunk of text) and inter-token latency (the
gap between consecutive chunks of text, pooled over requests) at p50 and p99, and errors (a
status other than 200, an error event, a stream without usage or ``[DONE]``, a transport error),
which must be 0; with a baseline, every figure's ratio new / old.

``OUT/results.json`` holds every number (each request's too), ``OUT/report.md`` the table (also
printed), ``OUT/<server>.log`` each server's output.  The exit status is 1 if any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import jax
import numpy as np

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.documents import read_documents
from agentic_jax.data.tokenizer import SPECIAL_TOKENS, train_tokenizer
from agentic_jax.eval.suites.report import write_files
from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.models.export import save_model
from pallas_kernels.benchmarking import describe_device

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "bench"
# The default checkpoint's shape: small enough that a CPU serves 64 clients, big enough that the
# engine, not the HTTP layer alone, does the work.
TINY = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)
TINY_VOCAB = 1024
SERVING = re.compile(r"serving .* at (http://\S+/v1)")


def tiny_checkpoint(path: Path, max_seq_len: int, seed: int) -> Path:
    """A random :data:`TINY` model over a BPE of the shipped corpus, saved as a run directory
    (``model/`` and ``tokenizer.json``).  Special tokens' embeddings are zero, so with tied
    embeddings their logits are 0 and greedy decoding never picks one (every reply runs to its
    ``max_tokens``)."""
    tokenizer = train_tokenizer(path / "tokenizer.json", vocab_size=TINY_VOCAB)
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, max_seq_len=max_seq_len, **TINY)
    params = init_params(config, jax.random.key(seed))
    params["embed"] = params["embed"].at[: len(SPECIAL_TOKENS)].set(0.0)
    save_model(path / "model", config, params)
    return path


class Server:
    """``python -m agentic_jax serve`` of the code at ``code_root``, in a subprocess whose output
    goes to ``log``; :attr:`url` once it listens."""

    def __init__(self, code_root: Path, checkpoint: str, gin_params: list[str], log: Path):
        command = [sys.executable, "-m", "agentic_jax", "serve", "--checkpoint", checkpoint]
        command += ["--port", "0", "--model_name", MODEL_NAME]
        for binding in gin_params:
            command += ["--gin_param", binding]
        env = {**os.environ, "PYTHONPATH": str(code_root)}
        self.log = log
        self.proc = subprocess.Popen(
            command,
            cwd=code_root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C of the bench does not reach it before close()
        )
        self.url: str | None = None
        self._listening = threading.Event()
        threading.Thread(target=self._copy_output, daemon=True).start()

    def _copy_output(self) -> None:
        """Copies the server's output to its log, noting its URL; wakes :meth:`wait` at the URL
        or at the end of the output (the server died)."""
        with open(self.log, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                match = SERVING.search(line)
                if match and self.url is None:
                    self.url = match.group(1)
                    self._listening.set()
        self._listening.set()

    def wait(self, timeout_s: float) -> str:
        """The server's URL once it listens; fails with its log's tail if it does not start."""
        if not self._listening.wait(timeout_s) or self.url is None:
            self.close()
            tail = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"the server did not start (see {self.log}):\n{tail}")
        return self.url

    def close(self) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it is not down within a minute."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def corpus_words() -> list[str]:
    return " ".join(read_documents(corpus_files("heldout"))).split()


def draw_request(rng: np.random.Generator, words: list[str], args) -> dict:
    """One chat completion: ``--prompt_words`` words from a random place, ``--max_tokens``."""
    length = int(rng.choice(args.prompt_words))
    start = int(rng.integers(0, len(words) - length))
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": " ".join(words[start : start + length])}],
        "max_tokens": int(rng.choice(args.max_tokens)),
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_one(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    """Sends ``body`` and reads its stream: the request's record (``error`` set if it failed)."""
    record = {"prompt_words": len(body["messages"][0]["content"].split())}
    record["max_tokens"] = body["max_tokens"]
    start = time.perf_counter()
    text_times, usage, done, error = [], None, False, None
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":  # read on to the response's end: the connection is reused
                        done = True
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        error = f"error event: {event['error']}"
                        break
                    usage = event.get("usage") or usage
                    if any(c.get("delta", {}).get("content") for c in event.get("choices", ())):
                        text_times.append(time.perf_counter())
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    if error is None and not (done and usage):
        error = "the stream ended without " + ("[DONE]" if usage else "usage")
    if error is None and not text_times:
        error = "the stream carried no text"
    if error is not None:
        return {**record, "error": error, "start": start, "end": end}
    return {
        **record,
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "text_chunks": len(text_times),
        "ttft_s": text_times[0] - start,
        "latency_s": end - start,
        "itl_s": np.diff(text_times).tolist(),
        "start": start,
        "end": end,
    }


async def run_load(url: str, words: list[str], args, phase: int, until) -> tuple[list, float]:
    """``--clients`` clients sending one request after another while ``until(records so far,
    seconds since the phase began)`` holds when a request would start; returns the records and
    the phase's start time."""
    endpoint = f"{url}/chat/completions"
    records: list[dict] = []
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    timeout = httpx.Timeout(args.request_timeout_s, connect=60.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        async def one_client(index: int) -> None:
            rng = np.random.default_rng([args.seed, index, phase])
            while until(records, time.perf_counter() - start):
                records.append(await stream_one(client, endpoint, draw_request(rng, words, args)))

        start = time.perf_counter()  # before any client runs
        await asyncio.gather(*(one_client(i) for i in range(args.clients)))
    return records, start


def percentiles(values: list[float]) -> dict:
    """p50 and p99 in milliseconds."""
    if not values:
        return {"p50_ms": None, "p99_ms": None}
    p50, p99 = np.percentile(values, [50, 99]) * 1e3
    return {"p50_ms": float(p50), "p99_ms": float(p99)}


def summarise(records: list[dict], start: float, args) -> dict:
    """A server's figures over the measured requests (whose records are kept, less their
    inter-token gaps and clock readings)."""
    ok = [r for r in records if "error" not in r]
    elapsed = max(r["end"] for r in records) - start
    output = sum(r["completion_tokens"] for r in ok)
    kept = ("start", "end", "itl_s")
    return {
        "clients": args.clients,
        "duration_s": args.duration_s,
        "elapsed_s": elapsed,
        "requests": len(ok),
        "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
        "completion_tokens": output,
        "output_tokens_per_s": output / elapsed,
        "requests_per_s": len(ok) / elapsed,
        "ttft": percentiles([r["ttft_s"] for r in ok]),
        "itl": percentiles([gap for r in ok for gap in r["itl_s"]]),
        "errors": len(records) - len(ok),
        "error_messages": sorted({r["error"] for r in records if "error" in r})[:10],
        "per_request": [{k: v for k, v in r.items() if k not in kept} for r in records],
    }


def measure(name: str, code_root: Path, checkpoint: str, words: list[str], args) -> dict:
    """Starts the server of ``code_root``, warms it up, measures it, stops it."""
    gin_params = [f"EngineConfig.num_slots = {args.num_slots}"]
    server = Server(code_root, checkpoint, gin_params, Path(args.out) / f"{name}.log")
    try:
        url = server.wait(args.startup_timeout_s)
        print(f"{name}: serving at {url}; warming up", flush=True)
        lengths = set(args.prompt_words)

        def warming(records: list[dict], elapsed: float) -> bool:
            answered = {r["prompt_words"] for r in records if "error" not in r}
            return elapsed < args.warmup_s or not lengths <= answered

        warm, _ = asyncio.run(run_load(url, words, args, 0, warming))
        failed = [r["error"] for r in warm if "error" in r]
        if failed:
            print(f"{name}: {len(failed)} warm-up requests failed, e.g. {failed[0]}", flush=True)
        records, start = asyncio.run(
            run_load(url, words, args, 1, lambda _, elapsed: elapsed < args.duration_s)
        )
    finally:
        server.close()
    result = {"code": str(code_root), **summarise(records, start, args)}
    print(
        f"{name}: budget {result['clients']} clients x {args.duration_s:g} s "
        f"({result['elapsed_s']:.1f} s to the last reply): {result['requests']} requests, "
        f"{result['prompt_tokens']} prompt + {result['completion_tokens']} output tokens, "
        f"{result['errors']} errors",
        flush=True,
    )
    return result


def baseline_code(commit: str, into: Path) -> Path:
    """The packages of ``commit`` written out of git history into ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "agentic_jax", "pallas_kernels", "sharding"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(
            f"cannot read commit {commit!r} from git history "
            f"({archive.stderr.decode().strip()}); --baseline none skips the old server"
        )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


FIGURES = [  # (label, path into a server's result, format)
    ("requests", ("requests",), "{:d}"),
    ("prompt tokens", ("prompt_tokens",), "{:d}"),
    ("output tokens", ("completion_tokens",), "{:d}"),
    ("measured s", ("elapsed_s",), "{:.1f}"),
    ("output tokens/s", ("output_tokens_per_s",), "{:.1f}"),
    ("requests/s", ("requests_per_s",), "{:.2f}"),
    ("TTFT p50 ms", ("ttft", "p50_ms"), "{:.0f}"),
    ("TTFT p99 ms", ("ttft", "p99_ms"), "{:.0f}"),
    ("inter-token p50 ms", ("itl", "p50_ms"), "{:.1f}"),
    ("inter-token p99 ms", ("itl", "p99_ms"), "{:.1f}"),
    ("errors", ("errors",), "{:d}"),
]


def figure(result: dict, path: tuple[str, ...]):
    for key in path:
        result = result[key]
    return result


def ratios(new: dict, old: dict) -> dict:
    """new / old of every figure both have (throughput: above 1 is better; latency: below)."""
    out = {}
    for label, path, _ in FIGURES:
        a, b = figure(new, path), figure(old, path)
        if a is not None and b:
            out[label] = a / b
    return out


def report(results: dict) -> str:
    s = results["setup"]
    servers = results["servers"]
    names = list(servers)
    lines = [
        f"Serving load on {s['device']}: {s['clients']} streaming clients for {s['duration_s']:g} s "
        f"per server on loopback, model {s['model']}, EngineConfig.num_slots={s['num_slots']}; "
        f"prompts of {s['prompt_words']} words, max_tokens {s['max_tokens']}, greedy.",
        "",
        "| | " + " | ".join(names) + (" | new / old |" if "ratio" in results else " |"),
        "| --- |" + " ---: |" * (len(names) + ("ratio" in results)),
    ]
    for label, path, fmt in FIGURES:
        cells = []
        for name in names:
            value = figure(servers[name], path)
            cells.append("n/a" if value is None else fmt.format(value))
        if "ratio" in results:
            ratio = results["ratio"].get(label)
            cells.append("" if ratio is None else f"{ratio:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="results.json, report.md, server logs")
    parser.add_argument("--init_from", help="a run directory (default: a random tiny model)")
    parser.add_argument(
        "--baseline", default="fbce723", help="the commit of the old server, or none"
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration_s", type=float, default=30.0)
    parser.add_argument("--warmup_s", type=float, default=10.0)
    parser.add_argument("--prompt_words", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--max_tokens", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--num_slots", type=int, default=32, help="EngineConfig.num_slots")
    parser.add_argument("--max_seq_len", type=int, default=2048, help="of the tiny model")
    parser.add_argument("--request_timeout_s", type=float, default=600.0)
    parser.add_argument("--startup_timeout_s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.clients < 1 or args.duration_s <= 0 or args.warmup_s < 0:
        raise SystemExit("--clients must be >= 1, --duration_s > 0 and --warmup_s >= 0")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    words = corpus_words()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoint = args.init_from
        if checkpoint is None:
            checkpoint = tiny_checkpoint(tmp / "tiny", args.max_seq_len, args.seed)
        checkpoint = str(Path(checkpoint).resolve())  # the servers run in their code's directory
        model = json.loads((Path(checkpoint) / "model" / "config.json").read_text())
        codes = {"new": ROOT}
        if args.baseline != "none":
            (tmp / "old").mkdir()
            codes["old"] = baseline_code(args.baseline, tmp / "old")
        servers = {
            name: measure(name, code, checkpoint, words, args) for name, code in codes.items()
        }
    results = {
        "setup": {
            **vars(args),
            "device": describe_device(),
            "model": args.init_from
            or f"random d={model['d_model']}, {model['n_layers']} layers, "
            f"vocab {model['vocab_size']}",
        },
        "servers": servers,
    }
    if "old" in servers:
        results["ratio"] = ratios(servers["new"], servers["old"])
    text = report(results)
    write_files(args.out, results, text + "\n", {})
    print(text)
    return results


if __name__ == "__main__":
    results = main()
    sys.exit(1 if any(s["errors"] for s in results["servers"].values()) else 0)
