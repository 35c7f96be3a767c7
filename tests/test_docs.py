"""Docs that run: every code block of README.md and docs/*.md is run, parsed or marked.

A block's fence info string says what happens to it:

- ``python``: executed, then checked by the function registered for it in
  ``CHECKS`` (keyed by file and heading): a plugin example is loaded into a
  plugin manager and its component is put through the core's own functions;
- ``gin``: parsed against the really registered configurables (the core's,
  the built-in plugins' and the components the docs' examples register), so
  a misspelt configurable or parameter fails;
- ``toml``: parsed; its ``rlax`` entry points must name a module;
- ``text``, ``bash``, ``sh``: not run (diagrams, formulas, synopses, output,
  shell commands).

Any other block, an unlabelled one included, or a python block without a
check, fails the inventory tests.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import pathlib
import re
import threading
import tomllib
import types
from collections.abc import Callable

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core import config
from rlax.core.errors import ConfigError, Preempted
from rlax.core.evaluation.curate import curate
from rlax.core.evaluation.evaluate import evaluate_pass_at_k
from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.plugins import PluginManager, build_plugin_manager
from rlax.core.rollout.groups import kept_by_filters, rollout
from rlax.core.rollout.reward_pool import RewardPool, score_one
from rlax.core.runtime import preemption
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.checkpoint import Checkpointer
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.types import Completion, Group, Prompt, RewardResult
from rlax.plugins.rewards.arithmetic import ArithmeticReward
from rlax.plugins.tasks.dataset import DatasetTask

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]

RUN = {"python", "gin", "toml"}
NOT_RUN = {"text", "bash", "sh"}

_FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>.*)$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    info: str  # the fence's info string
    heading: str  # the nearest heading above it
    text: str  # its content, dedented to the fence

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def key(self) -> str:
        return f"{self.path} § {self.heading}"


def read_blocks(path: str, root: pathlib.Path = ROOT) -> list[Block]:
    """The fenced blocks of one Markdown file, in order."""
    lines = (root / path).read_text().splitlines()
    blocks, heading, i = [], "", 0
    while i < len(lines):
        if lines[i].startswith("#"):
            heading = lines[i].lstrip("#").strip()
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, start = opening["indent"], i
        i += 1
        while i < len(lines) and lines[i].rstrip() != indent + "```":
            i += 1
        if i == len(lines):
            raise AssertionError(f"{path}:{start + 1}: unclosed code block")
        body = "\n".join(line[len(indent) :] for line in lines[start + 1 : i]) + "\n"
        blocks.append(Block(path, start + 1, opening["info"].strip(), heading, body))
        i += 1
    return blocks


BLOCKS = [block for path in DOCS for block in read_blocks(path)]


def of(info: str) -> list[Block]:
    return [b for b in BLOCKS if b.info == info]


def run(block: Block, **namespace: object) -> types.ModuleType:
    """Executes a python block as a module (names in ``namespace`` predefined)."""
    module = types.ModuleType("docs_" + re.sub(r"\W", "_", block.where))
    module.__dict__.update(namespace)
    exec(compile(block.text, block.where, "exec"), module.__dict__)  # noqa: S102
    return module


def block(key: str, info: str = "python") -> Block:
    (found,) = [b for b in of(info) if b.key == key]
    return found


def manager(*plugins: object) -> PluginManager:
    """The built-ins plus ``plugins`` (no third-party entry points)."""
    return build_plugin_manager(autoload=False, extra=plugins)


@pytest.fixture(autouse=True)
def fresh_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def prompt(text: str = "q", answer: object = "", tokenizer: CharTokenizer | None = None) -> Prompt:
    tokens = tokenizer.encode(text, bos=True) if tokenizer else np.array([1, 3], np.int32)
    return Prompt(id=text, text=text, tokens=tokens, answer=answer)


TINY = TransformerConfig(
    vocab_size=14, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


# -------------------------------------------------------------------------
# The inventory
# -------------------------------------------------------------------------


def test_the_docs_have_blocks_of_each_kind():
    assert {b.info for b in BLOCKS} >= {"python", "gin", "toml", "text", "bash"}


def test_every_block_is_run_or_marked_not_run():
    unknown = [f"{b.where}: ```{b.info}" for b in BLOCKS if b.info not in RUN | NOT_RUN]
    assert unknown == [], "label each block python, gin or toml (run) or text, bash, sh (not run)"


def test_every_python_block_has_a_check_and_every_check_a_block():
    keys = [b.key for b in of("python")]
    assert len(keys) == len(set(keys)), "one python block per heading"
    assert sorted(keys) == sorted(CHECKS)


def test_an_unlabelled_block_is_found(tmp_path):
    (tmp_path / "x.md").write_text("# T\n\n```\nrlax run\n```\n\n   ```gin\n   a.b = 1\n   ```\n")

    found = read_blocks("x.md", tmp_path)

    assert [(b.line, b.info, b.heading, b.text) for b in found] == [
        (3, "", "T", "rlax run\n"),
        (7, "gin", "T", "a.b = 1\n"),
    ]


# -------------------------------------------------------------------------
# gin and toml blocks
# -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc_plugins() -> list[types.ModuleType]:
    """Every python block that implements a hook, as a plugin module."""
    return [run(b) for b in of("python") if "@hookimpl" in b.text]


def parse(text: str, plugins: list[types.ModuleType]) -> PluginManager:
    """``text`` as a piece of an experiment: parsed after the quickstart's file (so the
    run specification's parts take its settings, as they do in any experiment)."""
    pm = manager(*plugins)
    config.register_core_configurables()
    config.parse(["quickstart"], [text], plugins=pm)
    return pm


@pytest.mark.parametrize("gin_block", of("gin"), ids=lambda b: b.where)
def test_gin_block_parses_against_the_registered_configurables(gin_block, doc_plugins):
    parse(gin_block.text, doc_plugins)


def test_the_readme_s_reward_is_the_run_s(doc_plugins):
    """The plugin example chooses the reward of the run: the one value the workers score
    with and both evaluations read (``spec.reward``)."""
    (block,) = [b for b in of("gin") if b.where.startswith("README.md")]
    spec = config.build_spec(parse(block.text, doc_plugins))

    assert type(spec.reward).__name__ == "Brevity" and spec.reward.max_chars == 3


def test_choosing_the_reward_for_one_role_alone_is_refused(doc_plugins):
    with pytest.raises(ConfigError) as err:
        parse("include 'quickstart.gin'\nrlax.train.reward = @rewards.brevity()\n", doc_plugins)
    assert str(err.value).endswith(
        "rlax.train.reward is the run's now, one value for every role: bind rlax.run.reward "
        "instead (configs/base/roles.gin)"
    )


# Where a reader or a run meets a setting's name (the README names one old binding on
# purpose, as the example of what is refused; the tests bind old names to see them refused).
NAMED_IN = ("docs", "configs", "examples", "benchmarks", "scripts")
TEXT_SUFFIXES = {".md", ".gin", ".py", ".yaml", ".toml", ".sh"}


def test_no_doc_config_example_or_script_names_a_setting_by_its_old_name():
    """A setting that moved (to the run specification, or elsewhere: ``config.MOVED``) is
    written under its new name wherever it is shown or bound; an old name would be refused."""
    old_names = re.compile(r"\b(?:" + "|".join(map(re.escape, config.MOVED)) + r")\b")
    paths = [
        path
        for folder in NAMED_IN
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts
    ]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match[0]}"
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if (match := old_names.search(line))
    ]
    assert found == []
    assert len(paths) > 100  # the walk found the tree
    assert old_names.search("rlax.train.task = %TASK") and not old_names.search("rlax.run.task")


def test_a_misspelt_parameter_in_a_gin_block_would_fail(doc_plugins):
    with pytest.raises(ConfigError, match="max_chars_x"):
        parse("rewards.brevity.max_chars_x = 40\n", doc_plugins)


@pytest.mark.parametrize("toml_block", of("toml"), ids=lambda b: b.where)
def test_toml_block_names_rlax_entry_points(toml_block):
    entry_points = tomllib.loads(toml_block.text)["project"]["entry-points"]["rlax"]

    assert entry_points
    for name, module in entry_points.items():
        assert name.isidentifier() and re.fullmatch(r"\w+(\.\w+)*", module), (name, module)


def entry_point_of_example(heading_key: str) -> None:
    """The toml block under a heading names the module its python block says it is."""
    (toml,) = [b for b in of("toml") if b.key == heading_key]
    (module,) = tomllib.loads(toml.text)["project"]["entry-points"]["rlax"].values()
    first_line = block(heading_key).text.splitlines()[0]
    assert first_line == f"# {module.replace('.', '/')}.py"


# -------------------------------------------------------------------------
# python blocks: one check each
# -------------------------------------------------------------------------


def check_readme_plugin(b: Block, tmp_path: pathlib.Path) -> None:
    plugin = run(b)
    pm = manager(plugin)
    assert pm.get("rewards", "brevity").factory is plugin.Brevity

    brevity = plugin.Brevity(max_chars=3)
    assert [brevity.score(prompt(), text) for text in ("abc", "abcd")] == [1.0, 0.0]
    assert score_one(brevity, prompt(), "ab") == (1.0, "")
    entry_point_of_example(b.key)


def check_my_reward(b: Block, tmp_path: pathlib.Path) -> None:
    plugin = run(b)
    reward = manager(plugin).get("rewards", "my_reward").factory()

    assert reward.score(prompt(answer="7"), " 7\n") == 1.0
    assert reward.score(prompt(answer="7"), "8") == 0.0
    entry_point_of_example(b.key)


def check_settings(b: Block, tmp_path: pathlib.Path) -> None:
    pm = manager(run(b))
    band = pm.get("rewards", "length_band").factory(min_length=2, max_length=3)
    assert [band.score(prompt(), t) for t in ("a", "ab", "abcd")] == [0.0, 1.0, 0.0]
    config.register_core_configurables()
    refused = {
        "rewards.length_band.unit='lines'": "rewards.length_band.unit: one of chars, words, got 'lines'",
        "rewards.length_band.miss=1.5": "rewards.length_band.miss: must be in [0, 1], got 1.5",
        "rewards.length_band.min_length=90": (
            "rewards.length_band.max_length: must be >= min_length (90), got 80"
        ),
    }
    for binding, message in refused.items():  # the text block's lines, through the parse
        with pytest.raises(ConfigError) as info:
            config.parse([], [binding], plugins=pm)
        assert str(info.value).endswith(message)
    config.parse(
        [], ["rewards.length_band.miss=0.5", "rewards.length_band.unit='words'"], plugins=pm
    )


def tiny_groups() -> list[Group]:
    rng = np.random.default_rng(0)
    groups = []
    for i, rewards in enumerate(([1.0, 0.0, 0.0], [0.0, 1.0, 1.0])):
        completions = tuple(
            Completion(
                rng.integers(3, 14, n).astype(np.int32), np.zeros(n, np.float32), "", "stop", 0
            )
            for n in (2, 3, 1)
        )
        tokens = rng.integers(3, 14, 3 + i).astype(np.int32)
        groups.append(Group(Prompt(str(i), "", tokens, ""), completions, np.array(rewards)))
    return groups


def check_algorithm(b: Block, tmp_path: pathlib.Path) -> None:
    algorithm = manager(run(b)).get("algorithms", "reinforce").factory()
    rewards = np.array([[1, 0, 1, 0], [1, 1, 1, 1]], np.float32)
    np.testing.assert_array_equal(
        algorithm.advantages(rewards), [[0.5, -0.5, 0.5, -0.5], [0, 0, 0, 0]]
    )
    no_baseline = type(algorithm)(baseline=False)
    np.testing.assert_array_equal(no_baseline.advantages(rewards), rewards)

    # The real train step calls advantages on the host and loss inside jit.
    groups = tiny_groups()
    batch = make_batch(groups, algorithm.advantages(np.stack([g.rewards for g in groups])))
    model = Transformer(TINY, rngs=nnx.Rngs(0))
    _, params = nnx.split(model)
    arrays = jax.tree.map(jnp.asarray, batch_arrays(batch))
    logp, _ = sequence_logprobs(model, arrays["tokens"], arrays["attention_mask"])
    expected = float(algorithm.loss(logp, arrays)[0])
    trainer = Trainer(model, algorithm, optax.sgd(0.1))

    metrics = trainer.step(batch)

    assert metrics["loss"] == pytest.approx(expected, abs=1e-6)
    assert expected != 0.0 and trainer.state.step == 1
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), params, trainer.state.params)
    assert any(jax.tree.leaves(moved))


def check_reward(b: Block, tmp_path: pathlib.Path) -> None:
    penalty = manager(run(b)).get("rewards", "length_penalty").factory(max_chars=3, per_char=0.5)

    assert penalty.score(prompt(), "abcdef") == RewardResult(-1.5, "3 chars over")
    with RewardPool(penalty, workers=0) as pool:
        result = pool.score([prompt(), prompt()], ["ab", "abcdef"])
    assert result.scores.tolist() == [0.0, -1.5]
    assert result.reasons == ["0 chars over", "3 chars over"]


def check_sampler(b: Block, tmp_path: pathlib.Path) -> None:
    sampler = manager(run(b)).get("samplers", "echo").factory(max_new_tokens=4)
    tokenizer = CharTokenizer("0123456789+-*=")
    model = Transformer(TINY, rngs=nnx.Rngs(0))
    sampler.setup(model, tokenizer)
    sampler.load_weights(nnx.state(model), 3)
    prompts = [prompt("7", "7", tokenizer), prompt("7", "77", tokenizer)]

    groups = rollout(prompts, sampler, ArithmeticReward(), group_size=2, seed=0)

    assert [[c.text for c in g.completions] for g in groups] == [["7", "77"], ["7", "77"]]
    assert [g.rewards.tolist() for g in groups] == [[1.0, 0.0], [0.0, 1.0]]
    assert {g.policy_version for g in groups} == {3}
    assert all(c.logprobs.shape == c.tokens.shape for g in groups for c in g.completions)
    pass_at_k = evaluate_pass_at_k(
        sampler, ArithmeticReward(), prompts, samples=2, ks=(1, 2), seed=0, progress=False
    )
    assert pass_at_k == {"pass@1": 0.5, "pass@2": 1.0}
    batch = make_batch(groups, np.zeros((2, 2)), completion_len=sampler.max_new_tokens)
    assert batch.tokens.shape[1] - len(prompts[0].tokens) >= sampler.max_new_tokens


def check_curation(b: Block, tmp_path: pathlib.Path) -> None:
    pm = manager(run(b))
    min_reward = pm.get("curation", "min_reward").factory(threshold=0.5)
    groups = [
        Group(
            prompt(),
            (Completion(np.zeros(1, np.int32), np.zeros(1), "", "stop", 0),) * 2,
            np.array(rewards, np.float32),
        )
        for rewards in ([0.0, 1.0], [0.0, 0.0])
    ]
    assert kept_by_filters(groups, [min_reward]) == [True, False]

    # rlax curate with the offline filter over a dataset task.
    rows = [
        {"id": "a", "question": "short", "answer": "1"},
        {"id": "b", "question": "a longer one", "answer": "2"},
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = DatasetTask(train_files=[str(data)], id_field="id")
    max_chars = pm.get("curation", "max_chars").factory(max_chars=10)

    assert curate(task=task, filters=[max_chars], output_dir=str(tmp_path / "out")) == 0

    kept = [json.loads(line) for line in (tmp_path / "out/train.jsonl").read_text().splitlines()]
    assert kept == [rows[0]]
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert [(d["id"], d["filter"], d["reason"]) for d in report["dropped"]] == [
        ("b", "MaxChars", "12 chars > 10")
    ]


def check_task(b: Block, tmp_path: pathlib.Path) -> None:
    pm = manager(run(b))
    task = pm.get("tasks", "countdown").factory()
    tokenizer = CharTokenizer("0123456789,")

    evals = list(task.prompts("eval", tokenizer=tokenizer, seed=0))
    assert [(p.text, p.answer) for p in evals] == [
        (f"{n},{n - 1},{n - 2},", str(n - 3)) for n in range(10, 100, 10)
    ]
    again = task.prompts("eval", tokenizer=tokenizer, seed=7)  # does not depend on the seed
    assert [(p.id, p.text) for p in again] == [(p.id, p.text) for p in evals]
    assert all(np.array_equal(p.tokens, tokenizer.encode(p.text, bos=True)) for p in evals)

    def train(seed: int) -> list[str]:
        stream = task.prompts("train", tokenizer=tokenizer, seed=seed)
        return [next(stream).text for _ in range(50)]  # endless: draw as many as needed

    assert train(0) == train(0) != train(1)
    assert not {int(t.split(",")[0]) % 10 for t in train(0)} & {0}  # never a held-out start
    with pytest.raises(ValueError, match="unknown split 'test'"):
        task.prompts("test", tokenizer=tokenizer, seed=0)

    reward = pm.get("rewards", task.default_reward).factory()
    assert [score_one(reward, evals[0], text)[0] for text in ("7", "8")] == [1.0, 0.0]


def check_logger(b: Block, tmp_path: pathlib.Path) -> None:
    from rlax.core.trainer.observe import Loggers

    logger = manager(run(b)).get("loggers", "json_lines").factory()
    # Called as the trainer calls its loggers.
    loggers = Loggers([logger])
    loggers.call("open", str(tmp_path), 0)
    for step in (1, 2):
        loggers.call("log_metrics", step, {"step": step, "reward": step / 4, "time": 1.0})
    loggers.call("log_traces", 2, [])
    loggers.close()

    lines = (tmp_path / "rewards.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "reward": 0.25},
        {"step": 2, "reward": 0.5},
    ]
    assert loggers.failures == {}


def check_environment(b: Block, tmp_path: pathlib.Path) -> None:
    from rlax.core.models.tokenizer import CharTokenizer
    from rlax.core.types import Prompt

    tokenizer = CharTokenizer("abgin")
    env = manager(run(b)).get("environments", "echo").factory()
    assert env.limits.max_turns == 2
    episode = env.start(Prompt("p", "a", tokenizer.encode("a", bos=True), None), tokenizer)
    observation = episode.step("ab")
    assert observation.text == "again"
    np.testing.assert_array_equal(observation.tokens, tokenizer.encode("again"))
    assert episode.step("ab") is None and episode.reward() == 1.0


def check_agent(b: Block, tmp_path: pathlib.Path) -> None:
    from rlax.core.types import Prompt

    class Client:  # answers "4" on the second request
        def __init__(self):
            self.asked = 0
            self.chat = self.completions = self

        def create(self, **request):
            self.asked += 1
            text = "4" if self.asked == 2 else "5"
            message = types.SimpleNamespace(content=text)
            return types.SimpleNamespace(choices=[types.SimpleNamespace(message=message)])

    agent = manager(run(b)).get("agents", "guesser").factory(tries=2)
    client = Client()
    assert agent(client, Prompt("p", "2+2=", np.zeros(1, np.int32), "4")) == 1.0
    assert client.asked == 2


def check_writing_an_agent(b: Block, tmp_path: pathlib.Path) -> None:
    from rlax.core.types import Prompt

    class Client:  # replies "five", then "5"
        def __init__(self):
            self.requests: list[dict] = []
            self.chat = self.completions = self

        def create(self, **request):  # as sent: a real client serialises it now
            self.requests.append(json.loads(json.dumps(request)))
            message = types.SimpleNamespace(content=["five", "5"][len(self.requests) - 1])
            return types.SimpleNamespace(choices=[types.SimpleNamespace(message=message)])

    agent = manager(run(b)).get("agents", "two_tries").factory
    client = Client()
    assert agent(client, Prompt("p", "2+3=", np.zeros(1, np.int32), "5")) == "5"
    first, second = (r["messages"] for r in client.requests)
    assert second[: len(first)] == first  # the second request extends the first
    assert [m["content"] for m in second[len(first) :]] == ["five", "A number only, please."]


def check_agent_quickstart(b: Block, tmp_path: pathlib.Path) -> None:
    from rlax.core.types import Prompt

    shipped = (ROOT / "plugins" / "agents" / "guess.py").read_text()
    assert b.text[b.text.index("def guess") :] in shipped  # the page shows the code that runs

    class Client:  # guesses 16, 24, 20 against the secret 20
        def __init__(self):
            self.requests: list[list[dict]] = []
            self.chat = self.completions = self

        def create(self, **request):
            self.requests.append(json.loads(json.dumps(request["messages"])))
            message = types.SimpleNamespace(content=["16", "24", "20"][len(self.requests) - 1])
            choice = types.SimpleNamespace(message=message, finish_reason="stop")
            return types.SimpleNamespace(choices=[choice])

    client = Client()
    assert run(b).guess(client, Prompt("p", "?", np.zeros(1, np.int32), 20)) == 1.0
    assert [m["content"] for m in client.requests[-1]] == ["?", "16", ">", "24", "<"]
    assert run(b).guess(Client(), Prompt("p", "?", np.zeros(1, np.int32), 7), max_guesses=3) == 0.0


def check_tool_parser(b: Block, tmp_path: pathlib.Path) -> None:
    from rlax.core.episodes import ToolCall

    parser = manager(run(b)).get("tool_parsers", "line").factory()
    assert parser.parse('think\nCALL add {"a": 1, "b": 2}\nthen') == [
        ToolCall("add", {"a": 1, "b": 2})
    ]
    assert parser.parse("no calls here") == []
    with pytest.raises(ValueError, match="not JSON"):
        parser.parse("CALL add {oops")
    assert parser.format_result(ToolCall("add", {}), "3") == "RESULT add: 3"


def check_weight_lane(b: Block, tmp_path: pathlib.Path) -> None:
    from rlax.core.param_server.client import ParamServerClient
    from rlax.core.param_server.server import ParamServer
    from rlax.core.param_server.settings import ServerSettings
    from rlax.core.wire import WirePlan

    config.parse([], [f"weight_lanes.files.root = '{tmp_path}'"], plugins=manager(run(b)))
    server = ParamServer(ServerSettings(address="127.0.0.1:0", token="t"), iter(()), capacity=1)
    address = f"127.0.0.1:{server.start()}"
    settings = ServerSettings(address=address, token="t", weight_lanes=("files", "grpc"))
    trainer, worker = ParamServerClient(settings, retry_s=0), ParamServerClient(settings, retry_s=0)
    try:
        tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
        plan = WirePlan.for_tree(tree)
        assert trainer.push(plan, tree, 0).committed
        version, _, buf = worker.pull(-1)
        assert version == 0 and bytes(buf) == plan.pack(tree).tobytes()
        assert worker.pull(0) is None and trainer.stat().version == -1  # all through the files
    finally:
        trainer.close()
        worker.close()
        server.stop(grace=None)


def check_critic(b: Block, tmp_path: pathlib.Path) -> None:
    config.parse(
        [],
        ["critics.mlp_head.width = 8", "algorithms.ppo.value_model = @critics.mlp_head()"],
        plugins=manager(run(b)),
    )
    algorithm = config.configured("algorithms", "ppo")()
    gin.clear_config()
    assert algorithm.value_model.width == 8
    groups = tiny_groups()
    batch = make_batch(groups, algorithm.advantages(np.stack([g.rewards for g in groups])))
    trainer = Trainer(Transformer(TINY, rngs=nnx.Rngs(0)), algorithm, optax.sgd(0.5))

    first = trainer.step(batch)
    second = trainer.step(batch)

    # Its values start at 0, its loss counts in the step's, and the step trains it.
    assert first["value_mean"] == 0.0 and first["value_loss"] > 0
    assert second["value_mean"] != 0.0 and second["value_loss"] < first["value_loss"]


def check_writing_an_environment(b: Block, tmp_path: pathlib.Path, capsys) -> None:
    module = run(b)
    lines = printed(capsys).strip().splitlines()
    assert len(lines) == 2 and len(module.episodes) == 2
    env = manager(module).get("environments", "repeat").factory(max_turns=2)
    assert env.limits.max_turns == 2
    for c in module.episodes:
        # Three one-id turns, the two digits shown between them (4 then 5), off the mask.
        assert c.loss_mask.tolist() == [1, 0, 1, 0, 1] and c.finish_reason == "stop"
        assert c.tokens[c.loss_mask == 0].tolist() == module.tok.encode("56").tolist()
        assert c.logprobs[c.loss_mask == 0].tolist() == [0.0, 0.0]
        shown, turns = "456", [module.tok.decode([t]) for t in c.tokens[c.loss_mask == 1]]
        assert c.episode["reward"] == sum(a == b for a, b in zip(turns, shown)) / 3
        assert c.episode["turns"] == 3 and c.episode["observation_tokens"] == 2


def printed(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out


def check_step_end(b: Block, tmp_path: pathlib.Path, capsys) -> None:
    manager(run(b)).hook.rlax_on_step_end(step=1, metrics={"loss": 0.5, "reward": 0.25})

    assert printed(capsys) == '{"loss": 0.5, "reward": 0.25, "step": 1}\n'


def check_weights_published(b: Block, tmp_path: pathlib.Path, capsys) -> None:
    manager(run(b)).hook.rlax_on_weights_published(version=1)

    assert printed(capsys) == "weights v1 are live\n"


def check_checkpoint(b: Block, tmp_path: pathlib.Path, capsys) -> None:
    hook = manager(run(b)).hook
    # Called as the trainer's Checkpointer calls it: once the save is complete on disk.
    ckpt = Checkpointer(
        tmp_path / "train_state",
        on_saved=lambda step, path: hook.rlax_on_checkpoint(step=step, path=path),
    )
    ckpt.save(3, {"w": np.zeros(2, np.float32)}, {})
    ckpt.wait()
    ckpt.close()

    assert printed(capsys) == f"checkpoint of step 3 at {tmp_path / 'train_state' / '3'}\n"


def check_preemption(b: Block, tmp_path: pathlib.Path, capsys) -> None:
    hook = manager(run(b)).hook
    stop = preemption.Preemption([], role="worker", hook=hook)
    stop.notify("SIGTERM")
    capsys.readouterr()

    with pytest.raises(Preempted):
        stop.stop_now()

    assert printed(capsys) == "worker preempted (SIGTERM); it will resume from its checkpoint\n"


def check_notice_source(b: Block, tmp_path: pathlib.Path) -> None:
    documented = run(b).NoticeSource

    def params(cls: type, method: str) -> list[str]:
        return list(inspect.signature(getattr(cls, method)).parameters)

    sources = (
        preemption.NoticeSource,
        preemption.SignalNotice,
        preemption.FileNotice,
        preemption.GceMetadataNotice,
    )
    for cls in sources:
        for method in ("start", "stop"):
            assert params(cls, method) == params(documented, method), (cls, method)
    seen, done = [], threading.Event()
    source = preemption.FileNotice(path=str(tmp_path / "preempt"), poll_s=0.01)
    source.start(lambda reason: (seen.append(reason), done.set()))
    (tmp_path / "preempt").touch()
    assert done.wait(5)
    source.stop()
    assert str(tmp_path / "preempt") in seen[0]


def check_public_algorithm(b: Block, tmp_path: pathlib.Path) -> None:
    # Only the public surface of rlax.plugins is imported, never a module path.
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(b.text))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert {m for m in imported if m and m.startswith("rlax.plugins")} == {"rlax.plugins"}
    factory = manager(run(b)).get("algorithms", "centred_dapo").factory
    algorithm = factory()
    rewards = np.array([[1, 0, 1, 0], [1, 1, 1, 1]], np.float32)
    np.testing.assert_array_equal(
        algorithm.advantages(rewards), [[0.5, -0.5, 0.5, -0.5], [0, 0, 0, 0]]
    )
    assert (algorithm.objective.eps_low, algorithm.objective.eps_high) == (0.2, 0.28)
    # A bad setting's error names the algorithm (settings_of).
    with pytest.raises(ValueError, match="^centred_dapo: "):
        factory(eps_high=-1.0)


def check_reward_pool(b: Block, tmp_path: pathlib.Path) -> None:
    ns = run(
        b,
        reward=ArithmeticReward(),
        prompts=[prompt("2+2=", "4"), prompt("2+3=", "5")],
        texts=["4", "five"],
    )
    result = ns.result

    assert result.scores.tolist() == [1.0, 0.0]
    assert result.failed.tolist() == [False, False]
    assert (result.errors, result.timeouts) == (0, 0)
    assert result.reasons == ["correct", "not an integer: 'five'"]


HOOKS = "docs/plugin_hooks.md § "
CHECKS: dict[str, Callable[..., None]] = {
    "README.md § Writing a plugin": check_readme_plugin,
    HOOKS + "Writing and installing a plugin": check_my_reward,
    HOOKS + "What a setting may be": check_settings,
    HOOKS + "rlax_register_algorithms() -> dict[str, Callable[..., object]]": check_algorithm,
    HOOKS + "rlax_register_rewards() -> dict[str, Callable[..., object]]": check_reward,
    HOOKS + "rlax_register_samplers() -> dict[str, Callable[..., object]]": check_sampler,
    HOOKS + "rlax_register_curation_filters() -> dict[str, Callable[..., object]]": check_curation,
    HOOKS + "rlax_register_tasks() -> dict[str, Callable[..., object]]": check_task,
    HOOKS + "rlax_register_loggers() -> dict[str, Callable[..., object]]": check_logger,
    HOOKS + "rlax_register_environments() -> dict[str, Callable[..., object]]": check_environment,
    HOOKS + "rlax_register_agents() -> dict[str, Callable[..., object]]": check_agent,
    HOOKS + "rlax_register_tool_parsers() -> dict[str, Callable[..., object]]": check_tool_parser,
    HOOKS + "rlax_register_weight_lanes() -> dict[str, Callable[..., object]]": check_weight_lane,
    HOOKS + "rlax_register_critics() -> dict[str, Callable[..., object]]": check_critic,
    HOOKS + "rlax_on_step_end(step: int, metrics: dict[str, float]) -> None": check_step_end,
    HOOKS + "rlax_on_weights_published(version: int) -> None": check_weights_published,
    HOOKS + "rlax_on_checkpoint(step: int, path: str) -> None": check_checkpoint,
    HOOKS + "rlax_on_preemption(role: str, reason: str) -> None": check_preemption,
    "docs/environments.md § Writing an environment": check_writing_an_environment,
    "docs/agents.md § Writing an agent": check_writing_an_agent,
    "docs/agents.md § The agent quickstart": check_agent_quickstart,
    "docs/algorithms.md § Writing a new algorithm": check_public_algorithm,
    "docs/preemption.md § Notices (`core/runtime/preemption.py`)": check_notice_source,
    "docs/rewards_and_data.md § Scoring in a pool: `rlax.core.rollout.reward_pool.RewardPool`": (
        check_reward_pool
    ),
}


@pytest.mark.parametrize("python_block", of("python"), ids=lambda b: b.where)
def test_python_block_runs_and_does_what_it_says(python_block, tmp_path, capsys):
    check = CHECKS[python_block.key]
    if "capsys" in inspect.signature(check).parameters:
        check(python_block, tmp_path, capsys)
    else:
        check(python_block, tmp_path)
