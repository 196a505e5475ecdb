"""``agentic-jax <verb>``: every job runs from gin configs in ``configs/``.

    agentic-jax train [--gin_file F]... [--gin_param P]... [--workdir DIR]
                      [--coordinator_address HOST:PORT --num_processes N --process_id I]
                      [--distributed]
    agentic-jax tokenizer [--workdir DIR] [--files F...] [--gin_param train_tokenizer.vocab_size=4096]
    agentic-jax convert SRC DST --to native|hf
    agentic-jax generate --checkpoint DIR --prompt TEXT [--chat | --no-chat] [--temperature T]
                         [--top_p P] [--top_k K] [--max_tokens N] [--seed S] [--gin_param P]...
    agentic-jax serve --checkpoint DIR [--host H] [--port P] [--model_name NAME] [--api_key KEY]
                      [--embedding_checkpoint DIR] [--gin_param P]...
    agentic-jax mcp-server [--checkpoint DIR] [--corpus DIR|FILE] [--skills DIR]
                           [--transport stdio|streamable-http] [--host H] [--port P]
    agentic-jax a2a-server --gin_file F [--checkpoint DIR] [--host H] [--port P] [--url URL]
                           [--bearer_token_env VAR] [--gin_param P]...
    agentic-jax agent --gin_file F [--checkpoint DIR] [--task TEXT | --task_file FILE]
                      [--trace FILE] [--yes] [--gin_param P]...
    agentic-jax team --gin_file F [--task TEXT] [--trace FILE] [--gin_param P]...
    agentic-jax route --gin_file F [--host H] [--port P] [--gin_param P]...
    agentic-jax ui --gin_file F [--checkpoint DIR] [--host H] [--port P] [--trace FILE]
                   [--approval_timeout_s S] [--gin_param P]...
    agentic-jax eval --suite NAME (--checkpoint DIR | --endpoint URL [--model M]) [--out DIR]
                     [--api_key_env VAR] [--gin_param P]...
                     (--suite arena: --checkpoint and --endpoint once per contestant)
    agentic-jax trace show FILE [--run ID]
    agentic-jax trace compare GOLDEN NEW [--golden_run ID] [--new_run ID] [--with_arguments]
                              [--min_similarity S] [--max_token_overhead O]

A misspelt configurable or parameter fails while parsing, before any work starts, with gin's
message naming the binding.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

DEFAULT_CONFIG = {"train": "quickstart"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentic-jax",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", required=True)

    def job(name, help_text, workdir=True):
        p = verbs.add_parser(name, help=help_text)
        p.add_argument(
            "--gin_file",
            action="append",
            default=[],
            help="a .gin file (a path, or a name in configs/); repeatable",
        )
        p.add_argument(
            "--gin_param",
            action="append",
            default=[],
            help="a gin binding such as 'train.steps=100'; repeatable, applied last",
        )
        if workdir:
            p.add_argument(
                "--workdir", default=None, help="output directory (default runs/<config>)"
            )
        return p

    def policy_checkpoint(p):
        p.add_argument(
            "--checkpoint",
            default=None,
            help="serve this checkpoint in-process as the policy (overrides the config)",
        )

    def listen(p, port: int):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=port)

    train = job(
        "train",
        "run a training job (default: the quickstart pipeline: tokenizer, "
        "pretraining, SFT and RL of a tool-using model)",
    )
    multi = train.add_argument_group(
        "multi-process (multi-host) training",
        "Run the same command in every process.  Each flag defaults to its environment variable "
        "(JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); with none of them set, "
        "training runs as a single process.",
    )
    multi.add_argument(
        "--coordinator_address",
        default=None,
        help="HOST:PORT of process 0, where the coordination service listens",
    )
    multi.add_argument("--num_processes", type=int, default=None, help="processes in the job")
    multi.add_argument("--process_id", type=int, default=None, help="this process, 0..N-1")
    multi.add_argument(
        "--distributed",
        action="store_true",
        help="detect the job from the cluster (TPU pod slice, SLURM, Open MPI)",
    )
    tok = job("tokenizer", "train a byte-level BPE tokenizer into WORKDIR/tokenizer.json")
    tok.add_argument(
        "--files",
        nargs="*",
        default=None,
        help="text or .txt.gz files (default: the shipped training corpus)",
    )
    conv = verbs.add_parser("convert", help="convert between Hugging Face and native checkpoints")
    conv.add_argument("src")
    conv.add_argument("dst")
    conv.add_argument(
        "--to",
        choices=("native", "hf"),
        required=True,
        help="native: HF directory -> agentic-jax model; hf: the reverse",
    )
    gen = job("generate", "stream a continuation of a prompt from a trained model", workdir=False)
    gen.add_argument(
        "--checkpoint",
        required=True,
        help="a training workdir (model/ and tokenizer.json) or a native model "
        "directory with a tokenizer.json",
    )
    gen.add_argument("--prompt", required=True)
    gen.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap the prompt as a ChatML user turn (default: if the tokenizer has chat tokens)",
    )
    for flag, kind in (
        ("temperature", float),
        ("top_p", float),
        ("top_k", int),
        ("max_tokens", int),
        ("seed", int),
    ):
        gen.add_argument(
            f"--{flag}",
            type=kind,
            default=None,
            help=f"default: default_sampling_params.{flag} (gin)",
        )
    serve = job("serve", "serve a model over an OpenAI-compatible HTTP API", workdir=False)
    serve.add_argument(
        "--checkpoint",
        required=True,
        help="a training workdir or a native model directory with a tokenizer",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--model_name",
        default=None,
        help="the model id clients send (default: the checkpoint's directory name)",
    )
    serve.add_argument(
        "--api_key",
        "--api-key",
        default=None,
        help="the bearer token every endpoint but /health requires "
        "(default: OpenAIServer.api_key (gin), else none)",
    )
    serve.add_argument(
        "--embedding_checkpoint",
        default=None,
        help="a trained retrieval encoder's run (train_encoder) to serve at /v1/embeddings, "
        "named by its directory (default: none, and that route is a 404)",
    )
    mcp = job(
        "mcp-server",
        "serve agentic-jax tools, run files and skills over the Model "
        "Context Protocol (stdio or Streamable HTTP)",
        workdir=False,
    )
    mcp.add_argument(
        "--checkpoint",
        default=None,
        help="a training workdir: adds a generate tool and its files as resources",
    )
    mcp.add_argument(
        "--corpus",
        default=None,
        help="a directory of .txt/.md files or one file: adds a search tool",
    )
    mcp.add_argument(
        "--skills",
        default=None,
        help="a directory of skill files, served as prompts (default: the shipped skills)",
    )
    mcp.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="streamable-http only")
    mcp.add_argument(
        "--port",
        type=int,
        default=8000,
        help="streamable-http only; the endpoint is http://HOST:PORT/mcp",
    )
    a2a = job(
        "a2a-server",
        "serve the agent a config describes over the Agent2Agent (A2A) protocol",
        workdir=False,
    )
    policy_checkpoint(a2a)
    listen(a2a, 9999)
    a2a.add_argument(
        "--url",
        default=None,
        help="the public base URL on the Agent Card (default http://HOST:PORT)",
    )
    a2a.add_argument(
        "--bearer_token_env",
        default=None,
        help="require 'Authorization: Bearer <token>', the token being this "
        "environment variable's value",
    )
    agent = job("agent", "run a tool-using agent on tasks, streaming its steps", workdir=False)
    policy_checkpoint(agent)
    tasks = agent.add_mutually_exclusive_group()
    tasks.add_argument(
        "--task",
        default=None,
        help="one task (default: the config's, else read tasks interactively)",
    )
    tasks.add_argument(
        "--task_file", default=None, help="one task per line, or JSONL with a 'task' field"
    )
    agent.add_argument("--trace", default=None, help="append the run's events to this JSONL file")
    agent.add_argument("--yes", action="store_true", help="approve dangerous tools without asking")
    team = job("team", "run a multi-agent team on a task, streaming its messages", workdir=False)
    team.add_argument("--task", default=None, help="the task (default: the config's)")
    team.add_argument("--trace", default=None, help="append the run's events to this JSONL file")
    route = job(
        "route",
        "serve an OpenAI-compatible proxy that routes each chat request to one of the config's "
        "upstreams by a contextual bandit learned from feedback",
        workdir=False,
    )
    listen(route, 8100)
    ui = job(
        "ui",
        "serve a web page that runs the agent (or team) a config describes, showing its steps",
        workdir=False,
    )
    policy_checkpoint(ui)
    listen(ui, 8080)
    ui.add_argument(
        "--trace", default="runs/ui/trace.jsonl", help="append every run's events to this file"
    )
    ui.add_argument(
        "--approval_timeout_s",
        type=float,
        default=60.0,
        help="a call in the 'ask' approval tier is denied when nobody answers in this time",
    )
    ev = job(
        "eval",
        "evaluate a checkpoint or an endpoint on a suite (configs/eval_<suite>.gin)",
        workdir=False,
    )
    from agentic_jax.config import config_dir

    suites = sorted(p.stem.removeprefix("eval_") for p in config_dir().glob("eval_*.gin"))
    ev.add_argument("--suite", required=True, help=", ".join(suites))
    ev.add_argument(
        "--checkpoint",
        action="append",
        help="a training workdir or model directory (the arena: one per contestant)",
    )
    ev.add_argument(
        "--endpoint",
        action="append",
        help="an OpenAI-compatible base URL ending in /v1 (the arena: one per contestant)",
    )
    ev.add_argument(
        "--model",
        action="append",
        help="the endpoint's model name (default 'default'; the arena: one, or one per endpoint)",
    )
    ev.add_argument(
        "--api_key_env", default=None, help="environment variable holding the endpoint's API key"
    )
    ev.add_argument("--out", default=None, help="report directory (default runs/eval_<suite>)")
    trace = verbs.add_parser("trace", help="show agent traces or compare one with a golden trace")
    trace_verbs = trace.add_subparsers(dest="trace_verb", required=True)
    show = trace_verbs.add_parser("show", help="render a JSONL trace as a transcript")
    show.add_argument("file")
    show.add_argument("--run", default=None, help="render only this run id (default: every run)")
    compare = trace_verbs.add_parser("compare", help="golden-trajectory regression check")
    compare.add_argument("golden")
    compare.add_argument("new")
    compare.add_argument(
        "--golden_run", default=None, help="run id in the golden trace (default: its last run)"
    )
    compare.add_argument(
        "--new_run", default=None, help="run id in the new trace (default: its last run)"
    )
    compare.add_argument(
        "--with_arguments", action="store_true", help="a call matches only with the same arguments"
    )
    compare.add_argument("--min_similarity", type=float, default=0.9)
    compare.add_argument("--max_token_overhead", type=float, default=0.25)
    return parser


def _setup(args) -> str:
    """Parses gin (failing fast on bad bindings) and returns the work directory."""
    from agentic_jax import config as gin_config

    if args.verb == "serve":  # the engine's and server's configurables only: no other stack
        import agentic_jax.inference.serving.openai_server
    else:
        import agentic_jax.registry  # noqa: F401  (registers every configurable before parsing)

    files = args.gin_file or ([DEFAULT_CONFIG[args.verb]] if args.verb in DEFAULT_CONFIG else [])
    if args.verb == "eval":
        files = [f"eval_{args.suite}", *files]
    gin_config.parse(files, args.gin_param)
    name = os.path.splitext(os.path.basename(files[-1]))[0] if files else args.verb
    return getattr(args, "workdir", None) or os.path.join("runs", name)


def _generate(args) -> None:
    """Streams the completion of ``args.prompt`` to stdout.  One prompt needs one slot; the rest
    of EngineConfig and the default sampling settings come from gin."""
    import dataclasses

    from agentic_jax.data.chat import render_ids
    from agentic_jax.data.tokenizer import IM_END, IM_START
    from agentic_jax.inference.serving.engine import (
        Engine,
        EngineConfig,
        Request,
        default_sampling_params,
        stream_text,
    )
    from agentic_jax.models.export import load_checkpoint

    config, params, tokenizer = load_checkpoint(args.checkpoint)
    chat = args.chat
    if chat is None:
        chat = {IM_START, IM_END} <= tokenizer.special_ids.keys()
    add_bos = tokenizer.bos_id is not None
    flags = ("temperature", "top_p", "top_k", "max_tokens", "seed")
    overrides = {k: getattr(args, k) for k in flags if getattr(args, k) is not None}
    sampling = default_sampling_params(**overrides)
    if chat:  # the assistant turn ends at <|im_end|>; EOS still ends it too
        prompt = render_ids(
            [{"role": "user", "content": args.prompt}],
            tokenizer,
            add_generation_prompt=True,
            add_bos=add_bos,
        ).ids.tolist()
        eos_id = tokenizer.token_id(IM_END)
        if tokenizer.eos_id is not None:
            sampling = dataclasses.replace(sampling, stop_token_ids=(tokenizer.eos_id,))
    else:
        prompt, eos_id = tokenizer.encode(args.prompt, add_bos=add_bos), tokenizer.eos_id
    engine = Engine(params, config, EngineConfig(num_slots=1), eos_id=eos_id, tokenizer=tokenizer)
    for piece in stream_text(engine, Request(prompt, sampling), tokenizer):
        print(piece, end="", flush=True)
    print()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class EncoderEmbedder:
    """A trained retrieval encoder (``retrieval.encoders.Encoder``) as the server's
    ``Embedder``: each text embedded as a passage (cut at ``EncoderConfig.passage_length``
    tokens), its trained shorter Matryoshka prefixes offered as ``dimensions``.  A
    late-interaction encoder has one vector per token, not per text, and is refused."""

    def __init__(self, encoder, name: str):
        if encoder.encoder.pooling == "tokens":
            raise ValueError(
                "a late-interaction encoder (pooling='tokens') has no single embedding per text "
                "to serve at /v1/embeddings"
            )
        self.encoder, self.name = encoder, name
        self.dimension = encoder.encoder.width(encoder.config)
        self.matryoshka_dimensions = tuple(d for d in encoder.dims if d < self.dimension)

    def embed(self, texts):
        from agentic_jax.inference.serving.openai_server import Embeddings

        tokens, mask = self.encoder.rows(texts, query=False)
        return Embeddings(self.encoder.embed_rows(tokens, mask), int(mask.sum()))


def _serve(args) -> None:
    """Serves until Ctrl-C or SIGTERM; EngineConfig, ServerLimits and the rest of OpenAIServer
    come from gin.

    Both signals are caught explicitly: a process started in the background by a shell
    inherits an ignored SIGINT, and container runtimes stop servers with SIGTERM.  uvicorn
    takes them while it serves, shuts down gracefully and raises them again for these handlers.
    """
    import logging
    import signal

    from agentic_jax.inference.serving.chat_model import ChatModel
    from agentic_jax.inference.serving.openai_server import OpenAIServer, ServerLimits

    name = args.model_name or os.path.basename(os.path.abspath(args.checkpoint))
    embedder = None
    if args.embedding_checkpoint is not None:
        from agentic_jax.retrieval.encoders import load_encoder

        path = os.path.abspath(args.embedding_checkpoint)
        embedder = EncoderEmbedder(load_encoder(path), os.path.basename(path))
    model = ChatModel.from_checkpoint(args.checkpoint)
    key = {} if args.api_key is None else {"api_key": args.api_key}  # else gin's, if bound
    server = OpenAIServer(
        model,
        host=args.host,
        port=args.port,
        model_name=name,
        limits=ServerLimits(),
        embedder=embedder,
        **key,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    print(f"serving {name!r} at {server.url} (Ctrl-C stops)", flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        server.serve_forever()
    finally:
        server.close()
        model.close()


def _mcp_server(args) -> None:
    """Serves until stdin ends (stdio) or until interrupted (streamable-http)."""
    from agentic_jax.agents.protocols.mcp_server import build_server, serve
    from agentic_jax.agents.protocols.skills import SkillRegistry

    skills = SkillRegistry.load(args.skills) if args.skills else SkillRegistry.load()
    server = build_server(checkpoint=args.checkpoint, corpus=args.corpus, skills=skills)
    if args.transport != "stdio":
        print(
            f"serving MCP at http://{args.host}:{args.port}/mcp (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
    try:
        serve(server, args.transport, host=args.host, port=args.port)
    finally:
        server.close()


@contextlib.contextmanager
def _configured_policy(config, checkpoint: str | None):
    """The policy of ``config`` (or ``checkpoint``) and the tools of its MCP servers; both are
    closed afterwards."""
    from agentic_jax.agents.policies.jax_policy import JaxPolicy
    from agentic_jax.agents.session import make_policy, open_mcp_client

    policy = make_policy(config, checkpoint)
    mcp = None
    try:
        mcp = open_mcp_client(config.mcp_servers)
        yield policy, (mcp.tools() if mcp is not None else ())
    finally:
        if mcp is not None:
            mcp.close()
        if isinstance(policy, JaxPolicy):
            policy.close()


def _a2a_server(args) -> None:
    """Serves the configured agent (``agents.AgentConfig``, card from ``agents.A2AServerConfig``)
    until interrupted."""
    import uvicorn

    from agentic_jax.agents.protocols.a2a_server import A2AServerConfig, config_app
    from agentic_jax.agents.session import AgentConfig

    token = None
    if args.bearer_token_env is not None:
        token = os.environ.get(args.bearer_token_env)
        if not token:
            raise SystemExit(f"--bearer_token_env: ${args.bearer_token_env} is unset or empty")
    config = AgentConfig()
    with _configured_policy(config, args.checkpoint) as (policy, mcp_tools):
        url = args.url or f"http://{args.host}:{args.port}"
        app = config_app(
            url, config, A2AServerConfig(), policy, bearer_token=token, mcp_tools=mcp_tools
        )
        print(
            f"serving A2A at {url} (card: {url}/.well-known/agent-card.json; Ctrl-C stops)",
            flush=True,
        )
        uvicorn.run(app, host=args.host, port=args.port)


def _agent(args) -> int:
    """Runs the configured agent on the tasks; 0 if every task was answered."""
    from agentic_jax.agents.session import (
        AgentConfig,
        interactive_tasks,
        read_tasks,
        run_session,
        terminal_approver,
    )

    config = AgentConfig()
    if args.task is not None:
        tasks = [args.task]
    elif args.task_file is not None:
        tasks = read_tasks(args.task_file)
    elif config.task is not None:
        tasks = [config.task]
    else:
        tasks = interactive_tasks()
    approver = (lambda tool, call: True) if args.yes else terminal_approver
    results = run_session(
        config,
        tasks,
        checkpoint=args.checkpoint,
        trace_path=args.trace,
        approver=approver,
        write=lambda line: print(line, flush=True),
    )
    return 0 if all(r.ok for r in results) else 1


def _ui(args) -> None:
    """Serves the UI of the configured team (``multi_agent.TeamConfig.team``, if bound) or
    agent (``agents.AgentConfig``) until interrupted."""
    import uvicorn

    from agentic_jax.agents.multi_agent.session import TeamConfig
    from agentic_jax.agents.session import AgentConfig, model_name
    from agentic_jax.agents.ui.app import ui_app
    from agentic_jax.agents.ui.runs import agent_work, team_work

    team = TeamConfig()
    with contextlib.ExitStack() as stack:
        model = None
        if team.team is not None:
            work, task, who = team_work(team.team), team.task, "team"
        else:
            config = AgentConfig()
            policy, mcp_tools = stack.enter_context(_configured_policy(config, args.checkpoint))
            work, task, who = agent_work(config, policy, mcp_tools), config.task, "agent"
            model = model_name(config, policy, args.checkpoint)
        app = ui_app(
            work,
            trace_path=args.trace,
            task=task or "",
            title=f"agentic-jax {who}",
            approval_timeout_s=args.approval_timeout_s,
            model=model,
        )
        print(
            f"serving the {who}'s UI at http://{args.host}:{args.port} (Ctrl-C stops)", flush=True
        )
        uvicorn.run(app, host=args.host, port=args.port)


def _team(args) -> int:
    """Runs the configured team; 0 if it reached an answer."""
    from agentic_jax.agents.multi_agent.session import TeamConfig, run_team

    result = run_team(
        TeamConfig(), args.task, trace_path=args.trace, write=lambda line: print(line, flush=True)
    )
    return 0 if result.ok else 1


def _route(args) -> None:
    """Serves the router proxy of the config (``multi_agent.RouterProxy``) until interrupted."""
    import uvicorn

    from agentic_jax.agents.multi_agent.router_proxy import RouterProxy

    proxy = RouterProxy()
    print(
        f"routing at http://{args.host}:{args.port}/v1 over {', '.join(proxy.upstreams)} "
        "(Ctrl-C stops)",
        flush=True,
    )
    uvicorn.run(proxy.app, host=args.host, port=args.port)


def _eval(args, workdir: str) -> int:
    """Runs the suite and prints the report; 0 when it was written."""
    from agentic_jax import config as gin_config
    from agentic_jax.eval.suites.run import evaluate

    out = args.out or workdir
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    gin_config.save_config(out, operative=False)
    evaluate(
        out,
        checkpoint=args.checkpoint,
        endpoint=args.endpoint,
        model=args.model or "default",
        api_key=api_key,
    )
    gin_config.save_config(out, operative=True)
    with open(os.path.join(out, "report.md"), encoding="utf-8") as report:
        print(report.read())
    written = sorted(p for p in os.listdir(out) if p.endswith((".json", ".md", ".png", ".gin")))
    print(f"wrote {', '.join(os.path.join(out, p) for p in written)}")
    return 0


def _trace(args) -> int:
    from agentic_jax.agents.context import golden, tracing

    try:
        if args.trace_verb == "show":
            events = tracing.load(args.file)
            if args.run is not None:
                events = tracing.run_events(events, args.run)
            print(tracing.render(events))
            return 0
        result = golden.compare_events(
            tracing.load(args.golden),
            tracing.load(args.new),
            golden_run=args.golden_run,
            new_run=args.new_run,
            with_arguments=args.with_arguments,
            min_similarity=args.min_similarity,
            max_token_overhead=args.max_token_overhead,
        )
    except (OSError, ValueError) as err:  # a missing or malformed file, an unknown run id
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.report())
    return 0 if result.passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.verb == "eval" and not (args.checkpoint or args.endpoint):
        parser.error("eval needs --checkpoint or --endpoint")
    if args.verb == "convert":
        from agentic_jax.models.export import hf_to_native, native_to_hf

        (hf_to_native if args.to == "native" else native_to_hf)(args.src, args.dst)
        print(f"wrote {args.dst}")
        return 0
    if args.verb == "trace":
        return _trace(args)
    workdir = _setup(args)
    try:
        if args.verb == "train":
            from agentic_jax.jobs import run_job
            from agentic_jax.training.distributed import initialize_distributed

            initialize_distributed(
                args.coordinator_address,
                args.num_processes,
                args.process_id,
                auto_detect=args.distributed,
            )
            result = run_job(workdir)
            print(
                "final: "
                + ", ".join(f"{k}={v:.4g}" for k, v in result.items() if isinstance(v, float))
            )
        elif args.verb == "tokenizer":
            from agentic_jax.data.tokenizer import train_tokenizer

            files = {} if args.files is None else {"files": args.files}
            tok = train_tokenizer(os.path.join(workdir, "tokenizer.json"), **files)
            print(f"wrote {os.path.join(workdir, 'tokenizer.json')} ({tok.vocab_size} tokens)")
        elif args.verb == "generate":
            _generate(args)
        elif args.verb == "serve":
            _serve(args)
        elif args.verb == "mcp-server":
            _mcp_server(args)
        elif args.verb == "a2a-server":
            _a2a_server(args)
        elif args.verb == "agent":
            return _agent(args)
        elif args.verb == "team":
            return _team(args)
        elif args.verb == "route":
            _route(args)
        elif args.verb == "ui":
            _ui(args)
        elif args.verb == "eval":
            return _eval(args, workdir)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
