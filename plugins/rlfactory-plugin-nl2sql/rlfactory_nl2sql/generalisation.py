"""The built-in nl2sql splits that test beyond the training templates (issue 40).

Every training question of the built-in data is one of the templates of
:data:`rlfactory_nl2sql.data.KINDS`, and so is every test question: copying the question's
entity into its kind's gold SQL solves the test split. Two more splits ask for more:

* ``test_skeletons``: questions whose gold SQL has a **skeleton** (the query with its
  literals masked, see :func:`skeleton`) that no training question has, in wordings no
  template uses. They need join paths the templates never take (the capitals of a
  country's neighbours; the currency of the country a capital belongs to; languages within a
  region), and aggregate and ordering patterns they never use (``AVG``, ``GROUP BY`` with
  ``HAVING``, an ascending top-1, an order by a computed ratio). Questions: every subregion,
  region, country or capital the facts suggest, at most :data:`PER_KIND` per kind, chosen by
  a stable hash.
* ``test_wordings``: the test split's questions asked in other words
  (:data:`WORDINGS`, one more wording per template), with the same gold SQL.

Both are scored like every built-in question: on the real database and on the check
database (:func:`rlfactory_nl2sql.facts.perturbed`), so a constant or a copied result does
not count.
"""

from __future__ import annotations

from typing import Iterator

import sqlglot
from sqlglot import expressions as exp

from .facts import Country, stable_int

__all__ = ["SKELETON_KINDS", "SKELETON_TOP_K", "WORDINGS", "PER_KIND", "skeleton", "join_path", "patterns",
           "skeleton_candidates"]

_CAPITAL_JOIN = "FROM countries AS c JOIN capitals AS cap ON cap.country_code = c.code"

#: The kinds of ``test_skeletons``: (question template, gold SQL template), slots as in KINDS
#: plus {count} and {area} (numbers).
SKELETON_KINDS: dict[str, tuple[str, str]] = {
    "capital_of_most_populous": (
        "Name the capital city of the country with the most inhabitants in {subregion}.",
        f"SELECT cap.name {_CAPITAL_JOIN} WHERE c.subregion = {{subregion}} ORDER BY c.population DESC LIMIT 1"),
    "smallest_area": (
        "Which country of {subregion} covers the smallest area?",
        "SELECT name FROM countries WHERE subregion = {subregion} ORDER BY area ASC LIMIT 1"),
    "densest": (
        "Which country in {subregion} has the most people per square kilometre?",
        "SELECT name FROM countries WHERE subregion = {subregion} ORDER BY population / area DESC LIMIT 1"),
    "average_population": (
        "On average, how many people live in a country of {subregion}?",
        "SELECT AVG(population) FROM countries WHERE subregion = {subregion}"),
    "count_larger_than": (
        "How many countries in {subregion} are bigger than {area} square kilometres?",
        "SELECT COUNT(*) FROM countries WHERE subregion = {subregion} AND area > {area}"),
    "many_neighbours": (
        "Which countries of {subregion} share borders with more than {count} other countries?",
        "SELECT c.name FROM countries AS c JOIN borders AS b ON b.country_code = c.code "
        "WHERE c.subregion = {subregion} GROUP BY c.name HAVING COUNT(*) > {count}"),
    "neighbour_capitals": (
        "Give the capitals of the countries that share a border with {country}.",
        "SELECT cap.name FROM countries AS c JOIN borders AS b ON b.country_code = c.code "
        "JOIN capitals AS cap ON cap.country_code = b.neighbour_code WHERE c.name = {country}"),
    "currency_by_capital": (
        "What money is used in the country whose capital city is {capital}?",
        "SELECT cu.name FROM capitals AS cap JOIN country_currencies AS cc ON cc.country_code = cap.country_code "
        "JOIN currencies AS cu ON cu.code = cc.currency_code WHERE cap.name = {capital}"),
    "language_in_region": (
        "In the {region} region, how many countries speak {language}?",
        "SELECT COUNT(*) FROM countries AS c JOIN country_languages AS cl ON cl.country_code = c.code "
        "JOIN languages AS l ON l.code = cl.language_code WHERE c.region = {region} AND l.name = {language}"),
}

#: The top-k kinds of ``test_skeletons``: a query of the ordering value (first column) and
#: what else must be known, in the gold's order, and k. A question is kept only when the
#: first k rows hold no NULL and the k-th value differs from the next (no tie decides it), on
#: both databases.
SKELETON_TOP_K: dict[str, tuple[str, int]] = {
    "capital_of_most_populous": ("SELECT c.population, cap.name FROM countries AS c LEFT JOIN capitals AS cap "
                                 "ON cap.country_code = c.code WHERE c.subregion = {subregion} "
                                 "ORDER BY c.population DESC", 1),
    "smallest_area": ("SELECT area FROM countries WHERE subregion = {subregion} ORDER BY area ASC", 1),
    "densest": ("SELECT population / area FROM countries WHERE subregion = {subregion} "
                "ORDER BY population / area DESC", 1),
}

#: One more wording of every training template (``test_wordings``): none is a template's.
WORDINGS: dict[str, str] = {
    "capital": "Which city is the capital of {country}?",
    "country_of_capital": "{capital} is the capital city of which country?",
    "population": "How many people live in {country}?",
    "area": "How large is {country}, in square kilometres?",
    "region_of": "{country} belongs to which world region?",
    "count_region": "What is the number of countries in the {region} region?",
    "count_subregion": "Count the countries that make up {subregion}.",
    "list_subregion": "Which countries belong to {subregion}?",
    "most_populous": "What is the most populous country of {subregion}?",
    "largest_three": "Give the three biggest countries by area in the {region} region, biggest first.",
    "total_population": "How many people live in {subregion} altogether?",
    "populous_over": "Name the countries of {subregion} whose population exceeds {threshold}.",
    "currency": "What money does {country} use?",
    "currency_countries": "In which countries do people pay with the {currency}?",
    "count_currency": "The {currency} is the money of how many countries?",
    "languages": "What languages do people speak in {country}?",
    "language_countries": "Which countries have {language} as a language?",
    "count_language": "What is the number of countries where people speak {language}?",
    "neighbours": "What are the neighbouring countries of {country}?",
    "count_neighbours": "How many neighbouring countries does {country} have?",
    "southern_capitals": "In the {region} region, which capitals are in the southern hemisphere?",
}

#: At most this many questions per kind of ``test_skeletons``.
PER_KIND = 30
_AREAS = (100_000, 500_000)
_COUNTS = (2, 3, 4)


def skeleton(sql: str) -> str:
    """The query with every literal masked (``?``), as sqlglot writes it, lowercased."""
    tree = sqlglot.parse_one(sql, read="sqlite")
    masked = tree.transform(lambda node: exp.Placeholder() if isinstance(node, exp.Literal) else node)
    return masked.sql(dialect="sqlite").lower()


def join_path(sql: str) -> tuple[str, ...]:
    """The tables a query reads, sorted, each as often as it is read."""
    return tuple(sorted(table.name.lower() for table in sqlglot.parse_one(sql, read="sqlite").find_all(exp.Table)))


def patterns(sql: str) -> tuple[str, ...]:
    """The query's aggregate and ordering patterns: its aggregate functions, ``group by``,
    ``having``, and each ``order by`` term's direction and whether it orders by a column or a
    computed value."""
    tree = sqlglot.parse_one(sql, read="sqlite")
    found = {type(node).__name__.lower() for node in tree.find_all(exp.AggFunc)}
    found |= {name for name, kind in (("group by", exp.Group), ("having", exp.Having)) if tree.find(kind)}
    for order in tree.find_all(exp.Ordered):
        target = "column" if isinstance(order.this, exp.Column) else "computed"
        found.add(f"order by {target} {'desc' if order.args.get('desc') else 'asc'}")
    return tuple(sorted(found))


def skeleton_candidates(countries: list[Country]) -> Iterator[tuple[str, str, dict[str, str]]]:
    """``(kind, key, slots)`` for every ``test_skeletons`` question the facts suggest, in a
    fixed order (before the gold SQL is run and :data:`PER_KIND` applied)."""
    subregions = sorted({c.subregion for c in countries})
    for subregion in subregions:
        slots = {"subregion": subregion}
        for kind in ("capital_of_most_populous", "smallest_area", "densest", "average_population"):
            yield kind, subregion, slots
        area = _AREAS[stable_int("area", subregion) % len(_AREAS)]
        yield "count_larger_than", subregion, {"subregion": subregion, "area": str(area)}
        count = _COUNTS[stable_int("count", subregion) % len(_COUNTS)]
        yield "many_neighbours", subregion, {"subregion": subregion, "count": str(count)}
    for c in countries:
        if c.borders:
            yield "neighbour_capitals", c.code, {"country": c.name}
        if c.capital and c.currencies:
            yield "currency_by_capital", c.code, {"capital": c.capital}
    speakers: dict[tuple[str, str], int] = {}
    for c in countries:
        for _, language in c.languages:
            speakers[(c.region, language)] = speakers.get((c.region, language), 0) + 1
    for (region, language), count in sorted(speakers.items()):
        if count >= 2:  # one speaking country would make "1" the answer of most pairs
            yield "language_in_region", f"{region}:{language}", {"region": region, "language": language}
