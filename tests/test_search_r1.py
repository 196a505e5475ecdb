"""Agentic RAG and Search-R1 (Jin et al. 2025, arXiv:2503.09516): the dense search tool inside
the jitted env, the multi-hop corpus task, retrieved tokens carrying no gradient, and the
``rl_search_r1`` config end to end on a tiny model."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import task_model_dir

from agentic_jax import rl
from agentic_jax.agents import env_tool
from agentic_jax.agents.tools.retrieval import Retriever, retrieval_tool
from agentic_jax.config import parse
from agentic_jax.envs.host import HostTextEnv
from agentic_jax.envs.text import (
    CorpusQA,
    DenseSearch,
    PassageIndex,
    Text,
    demonstration_actions,
    task_env,
)
from agentic_jax.envs.text.corpus_qa import HELDOUT_SEEDS, collection
from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import logprobs_of, token_logits
from agentic_jax.post_training.rl import RLConfig, _policy_loss, train_rl
from agentic_jax.post_training.rollout import collect
from agentic_jax.post_training.tasks import HELDOUT_SEED_OFFSET
from agentic_jax.retrieval import DenseIndex, DenseRetriever, exact_top_k
from agentic_jax.retrieval.encoders import Encoder, EncoderConfig
from agentic_jax.retrieval.trunk import text_rows
from agentic_jax.training.metrics import read_metrics

CLASSES = 12  # a small collection: quick to embed and to tokenize
ACTION = 64


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("search_r1")
    config, params, tokenizer = task_model_dir(path, max_seq_len=1024)
    return path, config, params, tokenizer


def _query(text: str) -> Text:
    return Text.from_bytes(text.encode(), 48)


# ------------------------------------------------------------------------------- the dense tool
def test_dense_search_ranks_as_exact_top_k_and_numpy_with_ties():
    """Rows of a table chosen by the query's first byte: the tool's hits are `exact_top_k`'s
    and numpy's stable argsort's, duplicated rows (exact ties) included, for both metrics."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(5, 8)).astype(np.float32)
    corpus = rng.normal(size=(20, 8)).astype(np.float32)
    corpus[7] = corpus[3]  # an exact tie: the lower row ranks first
    corpus[12] = 2 * corpus[3]  # a tie under cosine only
    passages = [f"passage {i}" for i in range(20)]
    for metric in ("dot", "cosine"):
        tool = DenseSearch(
            PassageIndex(corpus, passages),
            lambda text: jnp.asarray(table)[text.data[0] - ord("a")],
            top_k=4,
            metric=metric,
        )
        for letter in "abcde":
            query = table[ord(letter) - ord("a")]
            hits = np.asarray(jax.jit(tool.ranked)(_query(letter)))
            _, rows = exact_top_k(query[None], corpus, 4, metric=metric)
            np.testing.assert_array_equal(hits, np.asarray(rows)[0])
            scores = corpus @ query
            if metric == "cosine":
                scores = scores / np.linalg.norm(corpus, axis=1)
            np.testing.assert_array_equal(hits, np.argsort(-scores, kind="stable")[:4])
            assert tool.run_host(letter, None) == "\n".join(passages[i] for i in hits)


def test_a_trained_encoders_query_function_reads_the_query_byte_by_byte(model):
    """`Encoder.text_query_encoder` inside jit equals the encoder run on the host over the
    byte-token row of the same text, so a `DenseSearch` over a trained encoder's
    `DenseIndex` ranks as `DenseRetriever` over that row."""
    _, _, _, tokenizer = model
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
        head_dim=8, d_ff=32, max_seq_len=32,
    )  # fmt: skip
    encoder = Encoder(
        config,
        EncoderConfig(query_length=16),
        {"trunk": init_params(config, jax.random.key(1))},
        tokenizer,
        (),
    )
    query = "zip archive"
    inside = jax.jit(encoder.text_query_encoder())(_query(query))
    ids = tokenizer.byte_token_ids[np.frombuffer(query.encode(), np.uint8)]
    assert tokenizer.decode(ids.tolist()) == query
    row, mask = text_rows(tokenizer, [query], 16)
    row[0, 1 : 1 + len(ids)], row[0, 1 + len(ids)] = ids, tokenizer.eos_id
    mask[0] = np.arange(16) < len(ids) + 2
    np.testing.assert_allclose(inside, encoder.embed_rows(row, mask)[0], atol=1e-5)

    passages = [e.passage for e in collection()[:CLASSES]]
    index = DenseIndex(metric="dot")
    index.add([str(i) for i in range(len(passages))], encoder.encode_passages(passages))
    tool = DenseSearch(
        PassageIndex(index.embeddings(index.ids), passages), encoder.text_query_encoder(), top_k=3
    )
    dense = DenseRetriever(index, lambda texts: encoder.embed_rows(row, mask))
    assert [int(h.id) for h in dense.search(query, 3)] == np.asarray(
        tool.ranked(_query(query))
    ).tolist()


def test_the_corpus_task_replays_in_the_jitted_env_with_retrieved_tokens_masked(model):
    """A two-hop demonstration replayed through ``jax.jit(step_env)`` gives the rendered
    conversation token for token (the jitted search returns what the host search returned),
    its loss mask is the assistant mask (0 on every retrieved passage), and the answer earns
    the full reward."""
    _, _, _, tokenizer = model
    generator = CorpusQA(2, top_k=2, classes=CLASSES)
    env = task_env(tokenizer, generator, range(3), max_length=896, action_length=ACTION)
    step = jax.jit(env.step_env)
    for row, task in enumerate(generator.tasks(range(3))):
        rendered = task.render(tokenizer)
        _, state = env.reset_task(row, env.default_params)
        for action in demonstration_actions(rendered, ACTION, env.vocab.pad_id):
            _, state, reward, done, _, _ = step(
                jax.random.key(0), state, action, env.default_params
            )
        n = int(state.length)
        assert bool(done) and float(reward) == pytest.approx(1.0)
        assert n == len(rendered.ids) - 1  # all but the newline after the last <|im_end|>
        np.testing.assert_array_equal(state.tokens[:n], rendered.ids[:n])
        np.testing.assert_array_equal(state.loss_mask[:n], rendered.assistant_mask[:n])
        for message in task.demonstration[1::2][:2]:  # the two tool messages
            passage = tokenizer.encode(message.content.split("\n")[0], special=False)
            start = _find(np.asarray(state.tokens[:n]), passage)
            assert not np.asarray(state.loss_mask)[start : start + len(passage)].any()


def _find(haystack: np.ndarray, needle) -> int:
    for start in range(len(haystack) - len(needle) + 1):
        if haystack[start : start + len(needle)].tolist() == list(needle):
            return start
    raise AssertionError("passage not in the transcript")


def test_corpus_questions_are_deterministic_and_held_out_by_class():
    assert HELDOUT_SEEDS == HELDOUT_SEED_OFFSET
    generator = CorpusQA(2)
    assert generator.sample(5) == generator.sample(5)
    train = {t.answer + t.prompt[-1].content for t in generator.tasks(range(40))}
    heldout = generator.tasks(range(HELDOUT_SEEDS, HELDOUT_SEEDS + 20))
    classes = {e.name: e for e in collection()}

    def asked(task):  # the class the second search names
        return classes[task.demonstration[2].tool_calls[0].arguments["query"].split()[0]]

    assert all(asked(t).heldout for t in heldout) and not any(
        asked(t).heldout for t in generator.tasks(range(40))
    )
    assert not any(t.answer + t.prompt[-1].content in train for t in heldout)
    one_hop = CorpusQA(1).sample(3)
    assert len([m for m in one_hop.demonstration if m.role == "tool"]) == 1


def test_any_retriever_is_a_harness_tool_and_a_host_env_tool(model):
    """The harness's search tool over a dense retriever (not BM25) plays in a `HostTextEnv`."""
    _, _, _, tokenizer = model
    passages = ["jax traces python", "grain loads data", "optax updates"]
    index = DenseIndex(metric="dot")
    index.add(["j", "g", "o"], np.eye(3, 4))
    onehot = {"jax": 0, "grain": 1, "optax": 2}
    dense = DenseRetriever(index, lambda texts: np.eye(3, 4)[[onehot[t] for t in texts]])
    search = retrieval_tool(Retriever(passages, ["j", "g", "o"], index=dense), default_k=1)
    assert search(query="grain").startswith("[g] (score 1.00) grain loads data")
    task = CorpusQA(1, classes=CLASSES).sample(0)
    env = HostTextEnv(
        tokenizer, [task], CorpusQA(1).reward, tools=(env_tool(search),), max_length=512
    )
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "optax"}}\n</tool_call>'
    action = np.zeros((1, 96), np.int32)
    ids = tokenizer.encode(call)
    action[0, : len(ids)] = ids
    obs, *_ = env.step_env(env.reset_tasks([0])[1], action)
    assert "optax updates" in tokenizer.decode(obs["tokens"][0, : obs["length"][0]])


# ------------------------------------------------------------------------------- masking
def test_search_r1_masking_retrieved_tokens_carry_no_gradient(model):
    """Rollouts in which the search tool returned passages: the GRPO loss's gradient with
    respect to the logits is exactly 0 at every retrieved token (and every other non-policy
    token), nonzero on the policy's; changing the retrieved tokens' log-probs (the model's or
    the sampler's) leaves the loss unchanged, bit for bit."""
    path, _, _, tokenizer = model
    config, params, _ = load_checkpoint(path)
    generator = CorpusQA(2, top_k=2, classes=CLASSES)
    tasks = generator.tasks(range(2))
    env = task_env(tokenizer, generator, range(2), max_length=896, action_length=ACTION)
    script = [demonstration_actions(t.render(tokenizer), ACTION, env.vocab.pad_id) for t in tasks]

    def scripted(tokens, length, active, key):  # two demonstrations, two samples of each
        turn = scripted.turn = getattr(scripted, "turn", -1) + 1
        actions = np.stack([script[b // 2][turn] for b in range(4)])
        return actions, -0.5 * (actions != env.vocab.pad_id)

    rollouts = collect(
        params, config, env, env.default_params, [0, 1], group_size=2, key=jax.random.key(0),
        backend=scripted,
    )  # fmt: skip
    assert rollouts.tool_calls.tolist() == [2, 2, 2, 2]
    tokens, mask = jnp.asarray(rollouts.tokens), jnp.asarray(rollouts.loss_mask)
    retrieved = np.zeros(mask.shape, bool)  # the tool messages' passages
    for b in range(4):
        for message in tasks[b // 2].demonstration[1::2][:2]:
            for passage in message.content.split("\n"):
                ids = tokenizer.encode(passage, special=False)
                start = _find(rollouts.tokens[b], ids)
                retrieved[b, start : start + len(ids)] = True
    assert retrieved.sum() > 100 and not (rollouts.loss_mask[retrieved]).any()

    algo = RLConfig(group_size=2, prompts_per_step=2, loss_type="grpo")
    batch = {
        "tokens": tokens,
        "mask": mask,
        "old_logp": jnp.asarray(rollouts.behaviour_logp),
        "advantages": jnp.asarray([1.0, -1.0, 0.5, -0.5]),
    }
    trainer_loss = _policy_loss(config, algo, ACTION * 3)
    z = token_logits(params, config, tokens)

    def loss_of_logits(z, old_logp):  # the trainer's loss, from its logits on
        return rl.policy_loss(
            logprobs_of(z, tokens), old_logp, batch["advantages"], mask,
            loss_type="grpo", epsilon=algo.epsilon, max_length=ACTION * 3,
        ).total  # fmt: skip

    total, _, _ = trainer_loss(params, batch, jax.random.key(0))
    assert float(loss_of_logits(z, batch["old_logp"])) == pytest.approx(float(total), rel=1e-6)
    grad = np.abs(np.asarray(jax.grad(loss_of_logits)(z, batch["old_logp"]))).sum(-1)
    assert (grad[retrieved] == 0).all() and (grad[np.asarray(mask) == 0] == 0).all()
    assert grad[np.asarray(mask) == 1].max() > 0
    noise = jax.random.normal(jax.random.key(1), z.shape) * jnp.asarray(retrieved)[..., None]
    changed_old = batch["old_logp"] + jnp.asarray(retrieved) * 3.0
    assert float(loss_of_logits(z + 5 * noise, changed_old)) == float(
        loss_of_logits(z, batch["old_logp"])
    )


# ------------------------------------------------------------------------------- the config
def test_the_search_r1_config_trains_a_tiny_model_end_to_end(model, tmp_path):
    path, _, _, _ = model
    import agentic_jax.registry  # noqa: F401  (registers every configurable)

    parse(
        ["rl_search_r1"],
        [
            f"train_rl.init_from = '{path}'",
            "train_rl.steps = 2",
            "train_rl.eval_every = 0",
            "train_rl.progress = False",
            "RLConfig.group_size = 2",
            "RLConfig.prompts_per_step = 2",
            f"agentic_jax.envs.text.CorpusQA.classes = {CLASSES}",
            "rl/TaskSpec.num_train = 4",
            "rl/TaskSpec.num_heldout = 2",
            "rl/TaskSpec.max_length = 640",
            "rl/TaskSpec.action_length = 32",
        ],
    )
    try:
        last = train_rl(str(tmp_path / "run"))
    finally:
        gin.clear_config()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2] and np.isfinite(last["loss"])


def test_the_search_r1_pipeline_config_sfts_on_one_and_two_hops_and_rls_on_new_bridges():
    """``search_r1.gin``, the whole pipeline: SFT on one- and two-hop demonstrations, GRPO on
    bridge questions at seeds SFT never drew, every row of both stages fitting the model."""
    import agentic_jax.registry  # noqa: F401  (registers every configurable)

    parse(["search_r1"], [f"agentic_jax.envs.text.CorpusQA.classes = {CLASSES}"])
    try:
        assert str(gin.query_parameter("run_job.job")) == "@post_training"
        sft, rl_tasks = (
            gin.query_parameter(f"post_training.{name}_tasks").scoped_configurable_fn()
            for name in ("sft", "rl")
        )
        max_seq_len = TransformerConfig().max_seq_len
    finally:
        gin.clear_config()
    assert [g.difficulty for g in sft.generators] == [1, 2]
    assert [g.difficulty for g in rl_tasks.generators] == [2]
    assert rl_tasks.first_seed >= sft.first_seed + sft.num_train
    assert sft.context_length == rl_tasks.context_length == max_seq_len == 512
