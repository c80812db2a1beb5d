"""The env ``deepsearch``: answer questions by searching a passage corpus (Search-R1).

An episode is a question. The model may call the ``search`` tool (through the configured
parser: Search-R1's ``<search>`` tags by default, see below) any number of times within the
turn limit; each call returns the top passages, formatted as Search-R1 formats them
(``Doc 1(Title: ...) text``). A turn without a tool call ends the episode; its answer is
what it writes inside ``<answer>...</answer>`` (an answer without the tags is no answer,
as in Search-R1).

Out of the box everything is local and offline: the corpus and the questions are built from
the facts of the PyPI package ``countryinfo`` (:mod:`rlfactory_deepsearch.data`) and
searched with BM25 (``bm25s``), in process. The real Search-R1 setup swaps in its files and
a retriever server: ``train_file`` / ``test_file`` (Search-R1's NQ/HotpotQA parquet, or JSONL
samples), ``corpus`` (wiki-18 JSONL) or ``retriever: http`` with ``url`` (our ``rlf
retriever serve`` or Search-R1's own retrieval server).

Small models follow the tool-call format from worked examples in the prompt (``few_shot``),
rendered with the run's parser. The env's default parser is ``search_r1``, Search-R1's own
``<search> query </search>`` tags (:mod:`rlfactory_deepsearch.parser`): the embedded 135M model
writes a well-formed search for 88% of 200 training questions in that format at temperature
0.8, against 26% with JSON tool calls (``qwen3``), and with the JSON format it learned to stop
searching (bench/README.md). Any other parser works (``parser: qwen3`` for Qwen3 models).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import re
import threading
from pathlib import Path
from typing import Any, Sequence

from rlfactory_core import (ConfigError, EnvReset, EnvStep, InfrastructureError, Message, ParsedTurn,
                            RLFactoryError, Sample, ToolArgumentsError, ToolCall, ToolResult, files_fingerprint,
                            get_component, last_tag_content, normalize_answer)

__all__ = ["DeepSearchEnv", "SearchTool", "INSTRUCTION", "format_passages", "search_plan"]

#: Search-R1's instruction (``make_prefix`` in its ``nq_search.py``), with the search engine
#: offered as a tool instead of ``<search>`` tags.
INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call the search tool "
    "with a query and it will return the top searched results. You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>."
)
# A compact version for small models: the same contract in fewer tokens.
SHORT_INSTRUCTION = (
    "Answer the question. If you lack knowledge, call the search tool with a short query; it returns "
    "passages. Search as often as you need. Then give only the answer inside <answer> and </answer>."
)

_INSTRUCTIONS = {"short": SHORT_INSTRUCTION, "search-r1": INSTRUCTION}
#: The instruction with the search tool off (``use_tools: false``): the tools-off baseline.
NO_TOOLS_INSTRUCTION = "Answer the question. Give only the answer inside <answer> and </answer>."
#: What ``require_search`` says to an answer given before any search.
SEARCH_FIRST = "Search first: call the search tool to find the answer, then answer inside <answer> and </answer>."

#: Worked examples for small models: (question, [(query, passage found)], answer). The prompt
#: shows the first ``few_shot`` of them (two by default: a one-search and a two-search
#: question); all five cover each kind of fact the corpus holds (currency, region, capital,
#: language) and two questions of two hops. The countries are in the training split, so no
#: evaluation answer is given away (tests/test_data.py checks), and the passages are the
#: corpus's own.
EXAMPLES = (
    ("Which currency is used in Norway?",
     [("Norway currency", '"Norway"\nNorway uses the Norwegian Krone as its currency. Languages spoken in Norway '
                          'include Norwegian, Norwegian Bokmål and Norwegian Nynorsk.')],
     "Norwegian Krone"),
    ("In which region is the country whose capital is Asunción?",
     [("Asunción capital", '"Asunción"\nAsunción is the capital city of Paraguay.'),
      ("Paraguay region", '"Paraguay"\nParaguay lies in the Americas region, in Latin America and the Caribbean.')],
     "Americas"),
    ("What is the capital of Peru?",
     [("Peru capital", '"Lima"\nLima is the capital city of Peru. It lies at 12.06° S, 77.04° W.')],
     "Lima"),
    ("Which language is spoken in Egypt?",
     [("Egypt language", '"Egypt"\nEgypt uses the Egyptian Pound as its currency. Languages spoken in Egypt '
                         'include Arabic.')],
     "Arabic"),
    ("What currency is used in the country whose capital is Stockholm?",
     [("Stockholm capital", '"Stockholm"\nStockholm is the capital city of Sweden.'),
      ("Sweden currency", '"Sweden"\nSweden uses the Swedish Krona as its currency.')],
     "Swedish Krona"),
)


def format_passages(contents: Sequence[str]) -> str:
    """Passages (wiki-18 ``contents``: a quoted title line, then the text) as Search-R1's
    ``_passages2string`` writes them: ``Doc i(Title: "t") text``, one per line."""
    lines = []
    for i, passage in enumerate(contents, 1):
        title, _, text = passage.partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text.strip()}")
    return "\n".join(lines)


def extract_answer(text: str) -> str:
    """The content of the last ``<answer>`` pair outside ``<think>``; "" when there is none
    (in linear time, whatever the model wrote: see ``rlfactory_core.text``)."""
    return last_tag_content(text, "answer")


class CorpusUnavailable(RLFactoryError, InfrastructureError):
    """A sample names a corpus this env cannot search (the run's setup, not the model's call)."""


class SearchTool:
    """``search(query, topk)``: the top passages of the corpus for ``query``."""

    name = "search"
    description = "Search the knowledge base. Returns the passages that best match the query."

    def __init__(self, batcher: Any, topk: int, max_topk: int = 10):
        self._batcher = batcher
        self.topk, self.max_topk = topk, max_topk
        self.parameters = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to search for, a few words"},
                "topk": {"type": "integer", "minimum": 1, "maximum": max_topk,
                         "description": f"how many passages to return (default {topk})"},
            },
            "required": ["query"],
        }

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> str:
        query = str(arguments["query"]).strip()
        if not query:
            raise ToolArgumentsError("the query is empty; search for a few words")
        # A sample of test_counterfactual is answered from its own corpus (the changed world).
        sample = (ctx or {}).get("sample")
        corpus = sample.get("corpus") if hasattr(sample, "get") else None
        topk = int(arguments.get("topk") or self.topk)
        # (only then: a plain QueryBatcher searches one corpus)
        hits = await (self._batcher.search(query, topk, corpus) if corpus else self._batcher.search(query, topk))
        return format_passages([hit.document.contents for hit in hits]) if hits else "No passages found."

    async def close(self) -> None:
        """Stop the retrieval batcher (and an HTTP retriever's client); called by the tool
        manager at the end of the run."""
        await self._batcher.close()


class DeepSearchEnv:
    """Questions answered by searching a corpus (see the module docstring).

    :param retriever: ``bm25`` (default, in process), ``dense`` (an embedding model and
        faiss, the ``dense`` extra) or ``http`` (a Search-R1 retriever API at ``url``).
    :param url: the retriever server for ``retriever: http``.
    :param corpus: a wiki-18 style JSONL corpus (default: the built countryinfo corpus).
    :param train_file / test_file: the samples (Search-R1 parquet, or JSONL rows with
        ``question`` and ``golden_answers``); default: the built countryinfo splits.
    :param data_dir: where the countryinfo dataset is built (default under $RLFACTORY_HOME).
    :param topk: passages a search returns (Search-R1 uses 3).
    :param retriever_options: the retriever's own options (``make_retriever``): bm25
        ``k1``, ``b``, ``stemmer``; dense ``encoder`` (default the MiniLM shipped on PyPI),
        ``device``, prefixes; http ``timeout_s``. BM25 defaults to ``k1=0.5`` here: on short
        passages a passage matching more query words should beat one repeating the entity's
        name (recall@2 of the first needed passage, the question as the query, on the
        training questions: 0.97 against 0.89 with k1=1.5).
    :param few_shot: how many worked examples the prompt shows (``EXAMPLES``, at most five);
        true = two (a one-search and a two-search question), false = none. With all five the
        embedded model's searches name the fact asked for (``China capital``, not ``China``),
        but its base accuracy on the validation split fell from 0.104 to 0.065 (measured with
        the five in another order): it copied the query into its answer more often.
    :param instruction: ``short`` (default, fewer tokens for small models) or ``search-r1``
        (Search-R1's wording) or any text.
    :param parser: the parser that renders the examples' tool calls. The trainer passes the
        run's ``parser``; setting a different one is a config error.
    :param max_batch: searches of concurrent trajectories grouped into one retrieval call.
    :param require_search: an answer given before any search is sent back with "search
        first" (once per episode) instead of ending the episode. Off by default, as in
        Search-R1; for small models that otherwise learn to answer from memory.
    :param use_tools: offer the search tool (default). False is the tools-off baseline: the
        question answered from what the model knows, the worked examples answered without
        searching, no demonstrations.
    """

    name = "deepsearch"
    description = "Search-R1: answer questions by calling a search tool over a corpus (offline countryinfo data by default)."

    #: The config this env runs with unless the user sets otherwise: a CPU run with the
    #: embedded model (see the README), Search-R1's reward in training and plain exact match
    #: in evaluation.
    config_defaults: dict[str, Any] = {
        "parser": "search_r1",
        "rewards": [{"name": "search_r1"}],
        # the whole test split before training, after the cold start and at the end
        "eval": {"rewards": [{"name": "exact_match"}], "every": 8, "temperature": 0.0, "reuse_untrained": True},
        "rollout": {"max_turns": 4, "max_tokens_per_turn": 40, "max_trajectory_tokens": 1536,
                    "sampling": {"temperature": 0.8}},
        # after the warm-up most groups are all right: dynamic sampling keeps the informative ones
        "grpo": {"group_size": 8, "prompts_per_step": 4, "dynamic_sampling": True},
        # The base model makes one search and copies the wrong fact (0.104 on validation); a
        # warm-up on 64 demonstrations (the searches, then the gold answer) gave 0.844, two-hop
        # questions answered after two searches (bench/README.md).
        "cold_start": {"source": "demonstrations", "examples": 64, "lr": 5e-5},
        "train": {"steps": 8, "lr": 2e-5},
        "data": {"eval_size": None},
        "checkpoint": {"every": 4},
    }

    def __init__(self, retriever: str = "bm25", url: str | None = None, corpus: str | None = None,
                 train_file: str | None = None, test_file: str | None = None, data_dir: str | None = None,
                 topk: int = 2, retriever_options: dict[str, Any] | None = None, few_shot: bool | int = True,
                 instruction: str = "short",
                 parser: str = "search_r1", max_batch: int = 64, cache_dir: str | None = None,
                 require_search: bool = False, use_tools: bool = True):
        from .retrieval import retriever_option_problems

        defaults = {"k1": 0.5} if retriever == "bm25" else {}
        self.retriever_options = {**defaults, **(retriever_options or {})}
        # Every problem now, not at the first search, where it would only reach the model.
        problems = [f"env_options: {p}" for p in retriever_option_problems(retriever, self.retriever_options, url)]
        if retriever == "http" and corpus is not None:
            problems.append("env_options.corpus: the http retriever's server holds the corpus; drop corpus")
        if not 1 <= topk <= 10:
            problems.append(f"env_options.topk: must be between 1 and 10, got {topk}")
        if not isinstance(max_batch, int) or max_batch < 1:
            problems.append(f"env_options.max_batch: must be an integer >= 1, got {max_batch!r}")
        if instruction not in _INSTRUCTIONS and not (isinstance(instruction, str) and " " in instruction.strip()):
            problems.append(f"env_options.instruction: {instruction!r} is neither one of {', '.join(_INSTRUCTIONS)} "
                            "nor an instruction text")
        for key, path in (("corpus", corpus), ("train_file", train_file), ("test_file", test_file)):
            if path is not None and not Path(path).expanduser().is_file():
                problems.append(f"env_options.{key}: no file at {path}")
        if isinstance(few_shot, bool):
            few_shot = 2 if few_shot else 0
        if not isinstance(few_shot, int) or not 0 <= few_shot <= len(EXAMPLES):
            problems.append(f"env_options.few_shot: true, false or a number of worked examples from 0 to "
                            f"{len(EXAMPLES)}, got {few_shot!r}")
        if not isinstance(use_tools, bool):
            problems.append(f"env_options.use_tools: true or false, got {use_tools!r}")
        elif not use_tools and require_search:
            problems.append("env_options.require_search: needs the search tool; drop it or use_tools: false")
        if problems:
            raise ConfigError(problems)
        self.retriever_kind, self.url, self.topk = retriever, url, topk
        self.use_tools = use_tools
        self.corpus = Path(corpus).expanduser() if corpus else None
        self.files = {"train": train_file, "test": test_file}
        self.data_dir = Path(data_dir).expanduser() if data_dir else None
        self.cache_dir, self.max_batch = cache_dir, max_batch
        self.few_shot = few_shot
        self.require_search = require_search
        self.instruction = _INSTRUCTIONS.get(instruction, instruction) if use_tools else NO_TOOLS_INSTRUCTION
        self.parser = get_component("parser", parser)
        self.tools = [SearchTool(_LazyBatcher(self), topk)] if use_tools else []

    # ------------------------------------------------------------------ data

    @staticmethod
    def build_data(out_dir: Path | None = None, force: bool = False, progress: Any = None) -> Path:
        """Build the countryinfo dataset (``rlf data build deepsearch``); returns its directory."""
        from .data import build

        return build(out_dir, force=force, progress=progress)

    def dataset(self, size: int | None = None, split: str = "train") -> list[dict[str, Any]]:
        """``size`` samples of ``split`` (all of them when ``size`` is None or larger): the
        first ones of the built countryinfo split (``train``, ``validation``, ``test``, or one
        that tests beyond the training templates: ``test_wordings``, ``test_composition``,
        ``test_counterfactual``; already shuffled), or a fixed random subset of
        ``train_file`` / ``test_file``."""
        path = self.files.get(split)
        if path is not None:
            samples = _read_samples(Path(path).expanduser())
            if size is not None and size < len(samples):
                # Search-R1's files are ordered by source (NQ, then HotpotQA, ...): a fixed
                # random subset represents them all, the first rows would not.
                samples = random.Random(f"deepsearch:{split}").sample(samples, size)
            return samples
        if any(self.files.values()):
            given = ", ".join(f"{s}_file" for s, f in self.files.items() if f)
            raise ConfigError([f"env_options: {given} is set but there is no file for the {split!r} split; give "
                               f"{split}_file too (the built countryinfo questions do not match your corpus)"])
        from .data import load_split

        samples = load_split(split, data_dir=self.data_dir)
        named = {sample["corpus"] for sample in samples if sample.get("corpus")}
        problems = [f"env_options: {problem}" for problem in filter(None, map(self._corpus_problem, sorted(named)))]
        if problems:
            raise ConfigError(problems)
        return samples[:size] if size is not None else samples

    def _corpus_problem(self, corpus_name: str) -> str | None:
        """Why this env cannot search the corpus a sample names; None when it can."""
        from .generalisation import COUNTERFACTUAL

        if corpus_name != COUNTERFACTUAL:
            return f"a sample names the corpus {corpus_name!r}; deepsearch knows only {COUNTERFACTUAL!r}"
        if self.retriever_kind == "http":
            return ("test_counterfactual is answered from the changed world's corpus, which an http retriever's "
                    "server does not hold")
        if self.corpus is not None:
            return "test_counterfactual is answered from the built changed world's corpus; drop env_options.corpus"
        return None

    def data_fingerprint(self, samples: Sequence[Sample]) -> str | None:
        """The corpora the episodes of ``samples`` search (the env's, and the changed world's
        for the samples that name it), fingerprinted: ``eval.reuse_untrained`` keys on it.
        None for the http retriever (its server's corpus may change unseen) and the dense one
        (its embedding model is not fingerprinted)."""
        if not self.use_tools:
            return ""
        if self.retriever_kind != "bm25":
            return None
        from .data import counterfactual_corpus_path, default_corpus_path

        corpora = [self.corpus or (default_corpus_path() if self.data_dir is None else _built_corpus(self.data_dir))]
        if any(sample.get("corpus") for sample in samples if hasattr(sample, "get")):
            corpora.append(counterfactual_corpus_path(self.data_dir))
        return files_fingerprint(corpora)

    def _retriever(self, corpus_name: str | None = None) -> Any:
        """The retriever of the env's corpus, or of the corpus a sample names (``counterfactual``)."""
        from .retrieval import make_retriever

        if corpus_name is not None:
            problem = self._corpus_problem(corpus_name)
            if problem:
                # (samples from a JSONL file reach this at their first search: the env's setup
                # failed, not the model's query)
                raise CorpusUnavailable(problem, hint="evaluate it with the built-in retrievers (bm25 or dense)")
            from .data import counterfactual_corpus_path

            corpus: Path | None = counterfactual_corpus_path(self.data_dir)
        elif self.retriever_kind == "http":
            return make_retriever("http", url=self.url, **self.retriever_options)
        else:
            corpus = self.corpus
        if corpus is None:
            from .data import default_corpus_path

            corpus = default_corpus_path() if self.data_dir is None else _built_corpus(self.data_dir)
        from .cli_retriever import default_cache_dir

        return make_retriever(self.retriever_kind, corpus_path=corpus, cache_dir=self.cache_dir or default_cache_dir(),
                              **self.retriever_options)

    # ------------------------------------------------------------------ episodes

    def _examples(self) -> list[Message]:
        """The worked examples as a conversation: question, searches and their results in
        the parser's format, answer."""
        messages: list[Message] = []
        for question, searches, answer in EXAMPLES[:self.few_shot]:
            messages.append(Message(role="user", content=question))
            for query, passage in searches if self.use_tools else ():
                call = ToolCall(name="search", arguments={"query": query}, id=f"example-{len(messages)}")
                messages.append(Message(role="assistant", content=self.parser.format_tool_call(call)))
                messages += self.parser.render_tool_results(
                    [ToolResult(name="search", content=format_passages([passage]), call_id=call.id)])
            messages.append(Message(role="assistant", content=f"<answer>{answer}</answer>"))
        return messages

    async def reset(self, sample: Sample) -> EnvReset:
        question = sample.get("question") if hasattr(sample, "get") else None
        if not question:
            raise ValueError(f"a deepsearch sample needs a 'question', got keys {sorted(sample)}")
        messages = [Message(role="system", content=self.instruction)]
        if self.few_shot:
            messages += self._examples()
        messages.append(Message(role="user", content=str(question).strip()))
        return EnvReset(messages=messages, tools=list(self.tools), state={"searches": 0, "reminded": False})

    async def step(self, state: Any, turn: ParsedTurn, results: Sequence[ToolResult]) -> EnvStep:
        if turn.tool_calls or turn.errors:
            state["searches"] += sum(1 for result in results if result.ok)
            return EnvStep()  # the rollout shows the passages (or the parse errors)
        if self.require_search and not state["searches"] and not state["reminded"]:
            state["reminded"] = True
            return EnvStep(observation=[Message(role="user", content=SEARCH_FIRST)])
        return EnvStep(done=True, final_answer=extract_answer(turn.content))

    async def demonstration(self, sample: Sample, parser: Any) -> list[str] | None:
        """A worked episode for the cold start (``cold_start.source``): the searches a careful
        reader makes for a countryinfo question (its ``kind``: one search for a one-hop
        question, two for a two-hop one, as in the worked examples), then
        ``<answer>gold</answer>``. Each search is run here first and kept only when what it
        returns holds what the next step needs (the country a two-hop question leads to, then
        the answer), so a demonstration never answers from a fact it did not find. The core
        replays the turns through the agent loop (the searches really run) and keeps those the
        rewards call correct. None for other samples (Search-R1's files have no ``kind``), when
        a search misses, or for a parser without ``format_tool_call``."""
        plan = search_plan(sample) if hasattr(sample, "get") and self.use_tools else None
        if plan is None or not callable(getattr(parser, "format_tool_call", None)):
            return None
        turns = []
        for query, needed in plan:
            found = await self.tools[0].call({"query": query})
            if f" {normalize_answer(needed)} " not in f" {normalize_answer(found)} ":
                return None
            turns.append(parser.format_tool_call(ToolCall(name="search", arguments={"query": query})))
        return [*turns, f"<answer>{sample['answer']}</answer>"]

    async def close(self, state: Any) -> None:
        """Nothing per episode: the retriever is shared by all of them."""


#: The names a countryinfo question states, by kind (the phrasings of ``facts.TEMPLATES``).
_QUESTION_NAMES = {
    "country_of_capital": (r"^Which country has (?P<capital>.+) as its capital\?$",
                           r"^(?P<capital>.+) is the capital of which country\?$"),
    "currency_via_capital": (r"whose capital(?: city)? is (?P<capital>.+?)\?$",),
    "region_via_capital": (r"whose capital(?: city)? is (?P<capital>.+?)(?: in)?\?$",),
    "capital_via_currency_border": (r"uses the (?P<currency>.+) and borders (?P<neighbour>.+)\?$",
                                    r"borders (?P<neighbour>.+) and uses the (?P<currency>.+)\?$"),
}


def search_plan(sample: Sample) -> list[tuple[str, str]] | None:
    """The searches for a countryinfo question, as ``(query, what its results must hold)``:
    for a one-hop question the entity and the fact asked for ("Peru capital", the answer); for
    a two-hop one first the clue that names the country ("Lima capital", the country), then
    the country and the fact. The names the question states come from its ``slots`` (the
    splits beyond the training templates keep them) or from its phrasing (the shipped
    templates). None for a sample without a known ``kind``, ``entity`` and ``answer``, or a
    question in an unknown phrasing without ``slots``."""
    kind, entity, answer = sample.get("kind"), sample.get("entity"), sample.get("answer")
    if not (isinstance(kind, str) and isinstance(entity, str) and isinstance(answer, str) and entity and answer):
        return None
    if kind in ("capital", "currency", "language", "region"):
        return [(f"{entity} {kind}", answer)]
    names = sample.get("slots") if isinstance(sample.get("slots"), dict) else None
    for pattern in _QUESTION_NAMES.get(kind, ()) if names is None else ():
        found = re.search(pattern, str(sample.get("question", "")).strip())
        if found:
            names = found.groupdict()
            break
    if names is None:
        return None
    if kind == "country_of_capital" and "capital" in names:
        return [(f"{names['capital']} capital", answer)]
    clue, fact = kind.split("_via_", 1) if "_via_" in kind else (None, None)
    if fact == "capital" and "capital" in names:
        return [(f"{names['capital']} capital", entity), (f"{entity} {clue}", answer)]
    if fact == "currency_border" and {"currency", "neighbour"} <= set(names):
        return [(f"{names['currency']} {names['neighbour']}", entity), (f"{entity} {clue}", answer)]
    return None


class _LazyBatcher:
    """Builds a corpus's retriever on its first search: constructing the env (config checks,
    `rlf envs list`) must not load or index a corpus. Built once: concurrent first searches
    wait for the same build, and a search cancelled by its tool timeout does not restart it
    (the build goes on in its thread and the next search finds it done). One retriever and
    batcher per corpus a sample names (``None``: the env's corpus; ``counterfactual``: the
    changed world of ``test_counterfactual``)."""

    def __init__(self, env: DeepSearchEnv):
        self._env = env
        self._batchers: dict[str | None, Any] = {}
        self._retrievers: dict[str | None, Any] = {}
        self._build_lock = threading.Lock()

    def _build_once(self, corpus: str | None) -> Any:
        with self._build_lock:
            if corpus not in self._retrievers:
                self._retrievers[corpus] = self._env._retriever(corpus)
            return self._retrievers[corpus]

    async def search(self, query: str, topk: int, corpus: str | None = None) -> list[Any]:
        if corpus not in self._batchers:
            from .retrieval import QueryBatcher

            retriever = await asyncio.to_thread(self._build_once, corpus)
            if corpus not in self._batchers:  # no await since the check: one batcher
                # A remote retriever gets as many calls in flight as its client has connections:
                # round trips overlap, and a hung request holds one slot, not the queue.
                in_flight = getattr(retriever, "max_connections", 2) if self._env.retriever_kind == "http" else 1
                self._batchers[corpus] = QueryBatcher(retriever, max_batch=self._env.max_batch,
                                                      max_concurrent_batches=in_flight)
        return await self._batchers[corpus].search(query, topk)

    async def close(self) -> None:
        """Stop the batchers, then the retrievers' connections (an HTTP retriever's client)."""
        batchers, self._batchers = self._batchers, {}
        for corpus, batcher in batchers.items():
            await batcher.close()
            retriever = self._retrievers.get(corpus)
            close = getattr(retriever, "aclose", None) or getattr(retriever, "close", None)
            if close is not None:
                result = close()
                if inspect.isawaitable(result):
                    await result


def _built_corpus(data_dir: Path) -> Path:
    from .data import build

    return build(data_dir) / "corpus.jsonl"


def _read_samples(path: Path) -> list[dict[str, Any]]:
    """Samples from Search-R1's parquet or from JSONL rows with a ``question``."""
    if path.suffix == ".parquet":
        from .search_r1_format import load_search_r1_parquet

        return load_search_r1_parquet(path)
    from rlfactory_core import read_jsonl_samples

    samples = read_jsonl_samples(path, path.stem)
    for number, row in enumerate(samples, 1):
        if not row.get("question"):
            raise ConfigError([f"{path}: sample {number} ({row['id']}) needs a 'question'"])
        if not any(row.get(key) for key in ("golden_answers", "answers", "answer")):
            raise ConfigError([f"{path}: sample {number} ({row['id']}) needs its gold answers "
                               "('golden_answers': [...])"])
    return samples
