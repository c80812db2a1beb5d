"""The sql_execution reward: the documented values, order-aware comparison, errors and
timeouts counted, and its place in the core's reward layer (metrics, reward errors)."""

from __future__ import annotations

import pytest

from rlfactory_core import ConfigError, Message, RewardContext, Segment, Trajectory
from rlfactory_core.testing import RewardSpec, build_reward_layer
from rlfactory_nl2sql import SQLExecutionReward
from rlfactory_nl2sql.data import database_file
from rlfactory_nl2sql.reward import normalise_rows, same_result

PERU = "SELECT cap.name FROM countries AS c JOIN capitals AS cap ON cap.country_code = c.code WHERE c.name = 'Peru'"
OCEANIA_BY_AREA = "SELECT name FROM countries WHERE region = 'Oceania' ORDER BY area DESC LIMIT 3"
BALTIC = "SELECT name FROM countries WHERE code IN ('EST', 'LVA', 'LTU')"


def trajectory(reply: str | None, final_answer: str | None = "from reply") -> Trajectory:
    """A finished trajectory whose last model turn is ``reply``; the final answer is what the
    nl2sql env would extract from it, unless given."""
    from rlfactory_nl2sql import extract_sql

    t = Trajectory(sample_id="t", prompt_ids=[1])
    if reply is not None:
        t.messages = [Message("user", "Question: ..."), Message("assistant", reply)]
        t.segments = [Segment("model", [5], [-0.1])]
    t.final_answer = extract_sql(reply)[0] if final_answer == "from reply" else final_answer
    return t


@pytest.fixture
def db(built) -> str:
    return str(database_file(built))


def sample(db, query=PERU, **extra):
    return {"id": "s1", "db_id": "world", "question": "?", "query": query, "db_path": db, **extra}


ZERO = {"execution_match": 0.0, "format": 0.0, "no_answer": 0.0, "execution_error": 0.0, "timeout": 0.0,
        "check_db_mismatch": 0.0}


@pytest.mark.parametrize("reply, final_answer, value, changed", [
    # right result, in <answer> tags: 1 + f
    ("<answer>SELECT name FROM capitals WHERE country_code = 'PER'</answer>", "from reply", 1.1,
     {"execution_match": 1.0, "format": 1.0}),
    # right result in a ```sql block: the other documented form
    ("```sql\nSELECT name FROM capitals WHERE country_code = 'PER';\n```", "from reply", 1.1,
     {"execution_match": 1.0, "format": 1.0}),
    # right result given as bare text (another env's final answer): no format credit
    ("SELECT name FROM capitals WHERE country_code = 'PER'", "SELECT name FROM capitals WHERE country_code = 'PER'",
     1.0, {"execution_match": 1.0}),
    # runs, wrong result: the format credit alone
    ("<answer>SELECT name FROM capitals WHERE country_code = 'FRA'</answer>", "from reply", 0.1, {"format": 1.0}),
    ("<answer>SELECT name, latitude FROM capitals WHERE country_code = 'PER'</answer>", "from reply", 0.1,
     {"format": 1.0}),  # an extra column is a different result
    # fails: 0, counted
    ("<answer>SELECT capital FROM countries</answer>", "from reply", 0.0, {"execution_error": 1.0}),
    ("<answer>DROP TABLE capitals</answer>", "from reply", 0.0, {"execution_error": 1.0}),
    ("<answer>SELECT COUNT(*) FROM countries AS a, countries AS b, countries AS c, countries AS d</answer>",
     "from reply", 0.0, {"timeout": 1.0}),
    # no answer
    ("The capital is Lima.", "from reply", 0.0, {"no_answer": 1.0}),
    (None, None, 0.0, {"no_answer": 1.0}),
])
def test_reward_values(db, reply, final_answer, value, changed):
    reward = SQLExecutionReward(time_limit_s=0.3)
    output = reward.score(trajectory(reply, final_answer), sample(db))
    assert output.value == pytest.approx(value)
    assert output.components == {**ZERO, **changed}
    assert output.correct is (changed.get("execution_match") == 1.0)


def test_failures_are_recorded_in_the_trajectory(db):
    reward = SQLExecutionReward(time_limit_s=0.3)
    t = trajectory("<answer>SELECT capital FROM countries</answer>")
    reward.score(t, sample(db))
    assert t.metadata["sql_execution"] == {"error_kind": "sql_error", "error": "SQL error: no such column: capital"}
    t = trajectory("<answer>SELECT a.name FROM countries AS a, countries AS b</answer>")
    assert SQLExecutionReward(max_rows=100).score(t, sample(db)).components["execution_error"] == 1.0
    assert t.metadata["sql_execution"]["error_kind"] == "too_many_rows"


def test_order_counts_only_when_the_gold_query_orders(db):
    reward = SQLExecutionReward()
    ordered = sample(db, OCEANIA_BY_AREA)
    right = "SELECT name FROM countries WHERE region = 'Oceania' ORDER BY area DESC LIMIT 3"
    reversed_ = ("SELECT name FROM (SELECT name, area FROM countries WHERE region = 'Oceania' ORDER BY area DESC "
                 "LIMIT 3) ORDER BY area")
    assert reward.score(trajectory(f"<answer>{right}</answer>"), ordered).correct
    assert not reward.score(trajectory(f"<answer>{reversed_}</answer>"), ordered).correct
    unordered = sample(db, BALTIC)
    for order in ("name", "name DESC", "code"):
        assert reward.score(trajectory(f"<answer>{BALTIC} ORDER BY {order}</answer>"), unordered).correct
    # multisets: a row twice is not a row once
    twice = "SELECT name FROM countries WHERE code IN ('EST', 'LVA', 'LTU') UNION ALL SELECT 'Estonia'"
    assert not reward.score(trajectory(f"<answer>{twice}</answer>"), unordered).correct


def test_numbers_compare_by_value(db):
    reward = SQLExecutionReward()
    total = sample(db, "SELECT SUM(population) FROM countries WHERE subregion = 'Northern Europe'")
    as_float = "SELECT CAST(SUM(population) AS REAL) FROM countries WHERE subregion = 'Northern Europe'"
    assert reward.score(trajectory(f"<answer>{as_float}</answer>"), total).correct  # 2.0 == 2
    mean = sample(db, "SELECT AVG(area) FROM countries WHERE region = 'Europe'")
    summed = "SELECT SUM(area) / COUNT(area) FROM countries WHERE region = 'Europe'"
    assert reward.score(trajectory(f"<answer>{summed}</answer>"), mean).correct  # float noise is rounded away
    assert normalise_rows([(1.0000000001, 2.5, "x", None)]) == [(1, 2.5, "x", None)]
    assert same_result([(1,), (2,)], [(2,), (1,)], ordered=False)
    assert not same_result([(1,), (2,)], [(2,), (1,)], ordered=True)
    assert not same_result([(1, 2)], [(2, 1)], ordered=False)  # columns by position


def test_format_score_zero_is_plain_execution_accuracy(db):
    reward = SQLExecutionReward(format_score=0.0)
    assert reward.score(trajectory("<answer>SELECT 'Lima'</answer>"), sample(db)).value == 1.0
    assert reward.score(trajectory("<answer>SELECT 'Quito'</answer>"), sample(db)).value == 0.0


def test_samples_without_gold_sql_are_not_scored_and_bird_gold_is_read(db):
    reward = SQLExecutionReward()
    assert reward.score(trajectory("<answer>SELECT 1</answer>"), {"question": "?", "db_path": db}) is None
    bird = {"id": "b", "question": "?", "SQL": PERU, "db_path": db}
    assert reward.score(trajectory("<answer>SELECT 'Lima'</answer>"), bird).correct


def test_the_episode_database_comes_from_the_env_state(db, tmp_path):
    reward = SQLExecutionReward()
    context = RewardContext(state={"db_path": db}, tool_names=frozenset(), _tool_manager=None, _sample={},
                            _trajectory=None)
    row = {"id": "j1", "db_id": "world", "question": "?", "query": PERU}  # a JSONL row: no db_path
    assert reward.score(trajectory("<answer>SELECT 'Lima'</answer>"), row, context).correct
    with pytest.raises(ValueError, match="sample j1 has no database: run it in the nl2sql env"):
        reward.score(trajectory("<answer>SELECT 'Lima'</answer>"), row)


def test_the_gold_result_is_computed_once(db, monkeypatch):
    from rlfactory_nl2sql import reward as module

    calls = []
    real = module.run_query
    monkeypatch.setattr(module, "run_query", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    reward = SQLExecutionReward()
    for _ in range(3):
        reward.score(trajectory("<answer>SELECT 'Lima'</answer>"), sample(db))
    assert calls.count(PERU) == 1 and calls.count("SELECT 'Lima'") == 3


def test_bad_options_are_all_reported():
    with pytest.raises(ConfigError) as info:
        SQLExecutionReward(format_score=2, time_limit_s=0, max_rows=0, max_bytes=10, float_digits=-1)
    assert [e.split(" ")[0] for e in info.value.errors] == ["format_score", "time_limit_s", "max_rows", "max_bytes",
                                                           "float_digits"]
    with pytest.raises(ConfigError) as info:
        build_reward_layer([RewardSpec(name="sql_execution", options={"format_score": "high", "colour": "red"})])
    assert info.value.errors[0].startswith("rewards[0] (sql_execution): format_score must be a number in [0, 1]")
    assert info.value.errors[1] == ("rewards[0] (sql_execution): colour: unknown option (options: format_score, "
                                    "time_limit_s, max_rows, max_bytes, float_digits)")


async def test_in_the_reward_layer_errors_and_accuracy_become_metrics(db):
    """Four trajectories through the core's reward layer: right, wrong, timeout, and one whose
    sample has a broken gold SQL (a reward error, not a crash)."""
    layer = build_reward_layer([RewardSpec(name="sql_execution", options={"time_limit_s": 0.3})])
    trajectories = [
        trajectory("<answer>SELECT 'Lima'</answer>"),
        trajectory("<answer>SELECT 'Quito'</answer>"),
        trajectory("<answer>WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
                   "SELECT COUNT(*) FROM r</answer>"),
        trajectory("<answer>SELECT 'Lima'</answer>"),
    ]
    samples = [sample(db)] * 3 + [sample(db, "SELECT capital FROM countries", id="broken")]
    scored = await layer.score(trajectories, samples)
    assert scored.totals == pytest.approx([1.1, 0.1, 0.0, 0.0])
    metrics = scored.metrics("reward")
    assert metrics["reward/accuracy"] == pytest.approx(1 / 3)  # the broken sample is not judged
    assert metrics["reward/sql_execution/timeout"] == pytest.approx(1 / 3)
    assert metrics["reward/sql_execution/execution_match"] == pytest.approx(1 / 3)
    assert metrics["reward/errors"] == 1.0 and metrics["reward/errors/sql_execution"] == 1.0
    [error] = scored.reward_errors[3]
    assert error.startswith("sql_execution: RuntimeError: the gold SQL of sample broken failed on ")
    assert error.endswith("SQL error: no such column: capital; fix or drop this dataset row")
    await layer.close()
