"""Tools a text environment executes: inside jit (`run`) and on the host (`run_host`), with equal output.

A call arrives in the chat format of ``data/chat.py``::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}
    </tool_call>

Every tool here takes one string argument.  Inside jit the payload is
matched against the exact ``json.dumps`` layout that ``chat.render``
emits (what supervised warm-start teaches), with the argument a JSON string
without escapes (no ``"`` or ``\\``; ``chat`` also escapes ``<``);
anything else is a malformed call.  The host parses real JSON, so the two
agree on every call ``chat.render`` writes for an escape-free argument.

A tool returns the *content* of the tool message: text on the host, its
canonical token ids inside jit (computed integers via `vocab.encode_int`,
stored strings pre-tokenized by the task bank), so the environment's tool
turns tokenize exactly as ``chat.render_ids`` renders the same conversation.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.chat import ToolSpec
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text import calculator
from agentic_jax.envs.text.strings import Text, embed, equals, starts_with, strip, substring
from agentic_jax.envs.text.tasks import Task, TaskBank
from agentic_jax.envs.text.vocab import Vocab, encode_int, pack

MALFORMED = "error: unknown tool or malformed call"
NOT_FOUND = "error: key not found"


def token_table(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Pre-tokenized constant strings: ids ``[len(texts), width]`` and lengths."""
    encoded = [tokenizer.encode(t) for t in texts]
    ids = np.zeros((len(texts), max(map(len, encoded))), np.int32)
    for row, e in zip(ids, encoded):
        row[: len(e)] = e
    return ids, np.asarray(list(map(len, encoded)), np.int32)


class Tool:
    """One string-argument tool.  Subclasses set ``name``/``argument``/``messages``, the
    ``description`` a prompt shows (`spec`), and implement both runs.

    Tools hold no tokenizer: the environment tokenizes ``messages`` (the
    fixed strings a result may contain) and passes them to ``run``.
    """

    name: str
    argument: str
    messages: tuple[str, ...]
    description: str

    def __init__(self, argument_bytes: int = 48):
        self.argument_bytes = (
            argument_bytes  # longer arguments do not fit the jitted parser's buffer
        )

    @property
    def spec(self) -> ToolSpec:
        """What a task's prompt tells the model about the tool (``chat.with_tools`` renders it):
        the JSON schema of one string argument of at most ``argument_bytes`` characters, as the
        harness's tool of the same name states it.  Short on purpose: every prompt carries it."""
        argument = {"maxLength": self.argument_bytes, "type": "string"}
        parameters = {
            "additionalProperties": False,
            "properties": {self.argument: argument},
            "required": [self.argument],
            "type": "object",
        }
        return ToolSpec(self.name, self.description, parameters)

    @property
    def call_prefix(self) -> bytes:
        """``json.dumps`` of a call up to the opening quote of the argument value."""
        return json.dumps({"name": self.name, "arguments": {self.argument: ""}})[:-3].encode()

    def run(
        self, argument: Text, task: TaskBank, vocab: Vocab, messages
    ) -> tuple[jax.Array, jax.Array]:
        """Content ids ``[width]`` and length for one task row (jit).

        ``argument`` is ``[argument_bytes]`` (its length may exceed that: it
        did not fit); ``messages`` is `token_table` of ``self.messages``.
        """
        raise NotImplementedError

    def run_host(self, argument: str, task: Task) -> str:
        """The same content as text (host)."""
        raise NotImplementedError

    def host_argument(self, arguments: dict) -> object | None:
        """What `run_host` takes from a call's ``arguments`` object, or None when they do not fit
        the tool: here, exactly one string under ``self.argument`` (as `parse_call` reads)."""
        if set(arguments) != {self.argument} or not isinstance(arguments[self.argument], str):
            return None
        return arguments[self.argument]

    def succeeded(self, argument: Text, task: TaskBank, vocab: Vocab) -> jax.Array:
        """Whether ``run`` gives a result rather than an error message (jit); on the host a
        result is an error when it starts with ``error``, as every tool's error messages do."""
        del argument, task, vocab
        return jnp.bool_(True)


class Calculator(Tool):
    """Integer arithmetic (``calculator.py``): the value, or an error message."""

    name, argument = "calculator", "expression"
    messages = calculator.ERROR_MESSAGES[1:]
    description = "Integer arithmetic: + - * / (floor division) and parentheses."

    def run(self, argument, task, vocab, messages):
        result = calculator.evaluate(argument.data, argument.length)
        value_ids, value_length = encode_int(vocab, result.value)
        error_ids, error_length = messages[0][result.error - 1], messages[1][result.error - 1]
        ok = result.error == calculator.OK
        return pack(
            [
                (value_ids, jnp.where(ok, value_length, 0)),
                (error_ids, jnp.where(ok, 0, error_length)),
            ],
            max(value_ids.shape[0], error_ids.shape[0]),
            vocab.pad_id,
        )

    def succeeded(self, argument, task, vocab):
        return calculator.evaluate(argument.data, argument.length).error == calculator.OK

    def run_host(self, argument, task):
        result = calculator.evaluate_text(argument, self.argument_bytes)
        return (
            str(result.value)
            if result.error == calculator.OK
            else calculator.ERROR_MESSAGES[result.error]
        )


class Lookup(Tool):
    """Exact-key lookup in the task's fact table (multi-hop questions chain several)."""

    name, argument = "lookup", "key"
    messages = (NOT_FOUND,)
    description = "The value stored under a key in the task's facts."

    @staticmethod
    def _hits(argument: Text, task: TaskBank) -> jax.Array:
        """``bool [K]``: which keys of the task's table equal the argument."""
        table = task.table
        return jax.vmap(lambda key, length: equals(Text(key, length), argument))(
            table.keys, table.key_length
        )

    def run(self, argument, task, vocab, messages):
        table = task.table
        hits = self._hits(argument, task)
        index = jnp.argmax(hits)
        missing_ids, missing_length = messages[0][0], messages[1][0]
        found = jnp.any(hits)
        return pack(
            [
                (table.values[index], jnp.where(found, table.value_length[index], 0)),
                (missing_ids, jnp.where(found, 0, missing_length)),
            ],
            max(table.values.shape[-1], missing_ids.shape[0]),
            vocab.pad_id,
        )

    def succeeded(self, argument, task, vocab):
        return jnp.any(self._hits(argument, task))

    def run_host(self, argument, task):
        return dict(task.facts).get(argument, NOT_FOUND)


def top_rows(query: jax.Array, embedding: jax.Array, valid: jax.Array, k: int):
    """The ``k`` rows of ``embedding`` (``[N, D]``) with the largest dot product with ``query``
    (``[D]``), best first, and which of them are ``valid``; invalid rows score ``-inf``.  Full
    float32 precision and ``lax.top_k``'s tie rule (the lower row first), so the ranking equals
    ``retrieval.exact_top_k``'s on the same vectors."""
    scores = jnp.matmul(embedding, query, precision=jax.lax.Precision.HIGHEST)
    best = jax.lax.top_k(jnp.where(valid, scores, -jnp.inf), min(k, scores.shape[0]))[1]
    return best, valid[best]


def top_documents(
    query: Text, embedding: jax.Array, length: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
    """The ``k`` best documents by dot product with the query's `strings.embed`: (indices, which exist)."""
    return top_rows(embed(query, embedding.shape[-1]), embedding, length >= 0, k)


def join_rows(tokens, length, best, exists, separator, vocab: Vocab) -> tuple[jax.Array, jax.Array]:
    """The token rows ``best`` of ``tokens`` (``[N, W]``, real lengths ``length``) that
    ``exists``, joined by ``separator`` (``(ids, length)``): a search tool's message (jit)."""
    separator_ids, separator_length = separator
    segments = []
    for rank, (index, found) in enumerate(zip(best, exists)):
        segments += [
            (separator_ids, jnp.where(found & (rank > 0), separator_length, 0)),
            (tokens[index], jnp.where(found, length[index], 0)),
        ]
    return pack(segments, len(best) * (tokens.shape[-1] + separator_ids.shape[0]), vocab.pad_id)


class Search(Tool):
    """Top-k retrieval over the task's documents by hashed-trigram dot product; joined by newlines."""

    name, argument = "search", "query"
    messages = ("\n",)
    description = "The task's documents that best match a query, one per line."

    def __init__(self, top_k: int = 2, embedding_dim: int = 64, argument_bytes: int = 48):
        super().__init__(argument_bytes)
        self.top_k, self.embedding_dim = top_k, embedding_dim

    def run(self, argument, task, vocab, messages):
        corpus = task.corpus
        best, exists = top_documents(argument, corpus.embedding, corpus.length, self.top_k)
        separator = (messages[0][0], messages[1][0])
        return join_rows(corpus.tokens, corpus.length, best, exists, separator, vocab)

    def run_host(self, argument, task):
        if not task.documents:
            return ""
        query = Text.from_bytes(argument.encode()[: self.argument_bytes], self.argument_bytes)
        embedding = np.stack(
            [
                np.asarray(embed(Text.from_bytes(d.encode(), len(d.encode())), self.embedding_dim))
                for d in task.documents
            ]
        )
        best, _ = top_documents(
            query, embedding, np.zeros(len(task.documents), np.int32), self.top_k
        )
        return self.messages[0].join(task.documents[int(i)] for i in best)


class PassageIndex:
    """A fixed passage collection on the device: ``embeddings`` ``[N, D]`` and the passages'
    texts.  Shown by a short fingerprint (`repr`), not its contents, wherever a tool is
    described (eval suites' settings, gin's operative config)."""

    __slots__ = ("embeddings", "passages")

    def __init__(self, embeddings, passages: Sequence[str]):
        self.embeddings = np.asarray(embeddings, np.float32)
        self.passages = tuple(passages)
        if self.embeddings.ndim != 2 or len(self.embeddings) != len(self.passages):
            raise ValueError(
                f"need [N, D] embeddings for N passages, got {self.embeddings.shape} "
                f"for {len(self.passages)}"
            )

    def __repr__(self) -> str:
        digest = hashlib.sha256(self.embeddings.tobytes())
        digest.update("\f".join(self.passages).encode())
        size = f"n={len(self.passages)}, dim={self.embeddings.shape[1]}"
        return f"PassageIndex({size}, sha256={digest.hexdigest()[:12]})"


def trigram_encoder(dim: int) -> Callable[[Text], jax.Array]:
    """`strings.embed` at ``dim``: the encoder that needs no weights (hashed character trigrams)."""
    return functools.partial(embed, dim=dim)


def trigram_index(passages: Sequence[str], dim: int = 64) -> PassageIndex:
    """Passages embedded by `trigram_encoder` (one vmapped call)."""
    encoded = [p.encode() for p in passages]
    data = np.zeros((len(encoded), max(map(len, encoded))), np.uint8)
    for row, e in zip(data, encoded):
        row[: len(e)] = np.frombuffer(e, np.uint8)
    lengths = np.asarray([len(e) for e in encoded], np.int32)
    return PassageIndex(jax.vmap(lambda d, n: embed(Text(d, n), dim))(data, lengths), passages)


class DenseSearch(Tool):
    """Dense retrieval over one passage collection shared by every task, inside jit.

    The index (``index.embeddings [N, D]``) lives on the device with the step: a query is
    embedded by ``encode`` (any jittable ``Text -> [D]`` function: `trigram_encoder`, or a trained
    encoder's, ``retrieval.encoders.Encoder.text_query_encoder``), scored against every row at
    full precision and the ``top_k`` passages are returned, joined by newlines, as their
    pre-tokenized ids (the passages are this tool's ``messages``, tokenized once by the env).
    ``metric="cosine"`` normalises the rows and the query first.  This is the search engine of
    Search-R1 (Jin et al. 2025, arXiv:2503.09516) as an environment tool: rollouts interleave
    the policy's turns with its results, and only the policy's turns are trained.

    The host run (`run_host`, the demonstrations and the agent harness) ranks with the same
    jitted function, so both give the same passages.  A collection that does not fit on the
    device, or an index that is not a jnp function (BM25, a hybrid), searches on the host:
    ``agents.tools.retrieval.retrieval_tool`` over any ``retrieval.Retriever``, played by a
    `HostTextEnv` through ``agents.env_tool``.
    """

    name, argument = "search", "query"
    description = "Passages of the document collection that best match a query, one per line."

    def __init__(
        self,
        index: PassageIndex,
        encode: Callable[[Text], jax.Array] | None = None,
        *,
        top_k: int = 3,
        metric: str = "dot",
        argument_bytes: int = 48,
    ):
        super().__init__(argument_bytes)
        if metric not in ("dot", "cosine"):
            raise ValueError(f"metric must be 'dot' or 'cosine', got {metric!r}")
        if not 1 <= top_k <= len(index.passages):
            raise ValueError(f"top_k must be in [1, {len(index.passages)}], got {top_k}")
        self.index, self.top_k, self.metric = index, top_k, metric
        self.encode = encode or trigram_encoder(index.embeddings.shape[1])

    @property
    def messages(self) -> tuple[str, ...]:
        """The separator, then every passage: the env tokenizes them once for `run`."""
        return ("\n", *self.index.passages)

    def ranked(self, query: Text) -> jax.Array:
        """The rows of the ``top_k`` passages for ``query``, best first (jit)."""
        embedding, vector = jnp.asarray(self.index.embeddings), self.encode(query)
        if self.metric == "cosine":
            embedding = embedding / jnp.maximum(
                jnp.linalg.norm(embedding, axis=-1, keepdims=True), 1e-12
            )
            vector = vector / jnp.maximum(jnp.linalg.norm(vector), 1e-12)
        valid = jnp.ones(embedding.shape[0], bool)
        return top_rows(vector, embedding, valid, self.top_k)[0]

    def run(self, argument, task, vocab, messages):
        del task
        ids, lengths = messages
        best = self.ranked(argument)
        exists = jnp.ones(best.shape, bool)
        return join_rows(ids[1:], lengths[1:], best, exists, (ids[0], lengths[0]), vocab)

    def run_host(self, argument, task):
        del task
        query = Text.from_bytes(argument.encode()[: self.argument_bytes], self.argument_bytes)
        return "\n".join(self.index.passages[int(i)] for i in _host_ranked(self, query))


_host_ranked = jax.jit(DenseSearch.ranked, static_argnums=0)  # compiled once per tool


def parse_call(payload: Text, tools: Sequence[Tool]) -> tuple[jax.Array, Text]:
    """Which tool a call payload names (-1: malformed) and the raw argument value (a view of ``payload``)."""
    start, end = strip(payload, 0, jnp.minimum(payload.length, payload.data.shape[0]))
    value_end = end - 3  # before '"}}'
    index, value_start = jnp.int32(-1), end
    for i, tool in enumerate(tools):  # the prefixes differ, so at most one matches
        named = starts_with(payload, tool.call_prefix, start) & (
            start + len(tool.call_prefix) <= value_end
        )
        index, value_start = (
            jnp.where(named, i, index),
            jnp.where(named, start + len(tool.call_prefix), value_start),
        )
    position = jnp.arange(payload.data.shape[0])
    escaped = jnp.any(
        (position >= value_start)
        & (position < value_end)
        & jnp.isin(payload.data, jnp.asarray([ord('"'), ord("\\")], jnp.uint8))
    )
    well_formed = payload.fits & starts_with(payload, b'"}}', value_end) & ~escaped
    return jnp.where(well_formed, index, -1), substring(
        payload, value_start, value_end, payload.data.shape[0]
    )


def parse_call_host(payload: str, tools: Sequence[Tool]) -> tuple[Tool | None, str]:
    """The host's parse of a call payload: the tool (None: malformed or unknown) and its argument.

    Real ``json``: escapes are decoded and any whitespace is accepted, so
    host-only tools (code, arbitrary text) can take any string.  On the
    calls ``chat.render`` produces for escape-free arguments it agrees with
    `parse_call`.
    """
    try:
        call = json.loads(payload)
    except ValueError:
        return None, ""
    named = {t.name: t for t in tools}
    if (
        not isinstance(call, dict)
        or set(call) != {"name", "arguments"}
        or call["name"] not in named
    ):
        return None, ""
    tool, arguments = named[call["name"]], call["arguments"]
    argument = tool.host_argument(arguments) if isinstance(arguments, dict) else None
    if argument is None:
        return None, ""
    return tool, argument
