"""The deepsearch splits that test beyond the shipped templates: whether a model answers
from what it retrieves, or from what it memorised in training.

The shipped test split asks about countries no training question is about, but in the
training questions' 8 kinds and 2-3 phrasings each. These three splits, built with the
others (:func:`rlfactory_deepsearch.data.build`), each change one thing:

* ``test_wordings``: the test split's questions in phrasings no training template uses
  (:data:`WORDINGS`: "Name the capital of Peru.", "People in the country governed from
  Lima pay with which currency?"), about the same test countries; same answers.
* ``test_composition``: kinds that chain hops the training questions make only separately
  (:data:`COMPOSITIONS`): the language of the country whose capital is named (training asks a
  capital's country and a country's language, never both in one question), and the region or
  the language of the country that uses a currency and borders a neighbour (training asks
  that country's capital only). About every country: the composition is what no training
  question asks (a training country's single facts were trained on, one by one).
* ``test_counterfactual``: the test split's questions over a **changed world**
  (``corpus_counterfactual.jsonl``): every country takes its capital from another country,
  its currencies, languages and region from others again (fixed shuffles of all of them, so
  the world stays consistent: each capital still names one country), and the passages say
  so ("Paris is the capital city of Peru."). The right answer is what the passages say; only questions whose
  counterfactual answer differs from every real one are kept, so a memorised answer scores
  0. Its samples carry ``"corpus": "counterfactual"``: the env's search tool searches that
  corpus for them (the built-in retrievers only; an ``http`` retriever serves one corpus).

What never changes: the corpus of the other splits, the training data, the scoring. Tests
(``tests/test_generalisation.py``) check that no question of ``test_wordings`` or
``test_composition`` is a training question (after answer normalisation), that no
``test_wordings`` phrasing is a training template (the names a question states masked), that
no ``test_composition`` kind occurs in training while each of its hops does, and that a
``test_counterfactual`` question that is also a training question (a training country's
capital now names a test country) has none of the training answers. Samples of these splits
keep the names their question states (``slots``), so the scripted solver
(:func:`rlfactory_deepsearch.env.search_plan`) needs no pattern for the new phrasings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlfactory_core import normalize_answer

from .facts import (KINDS, TEMPLATES, Country, World, ask, corpus_rows, language_answers, questions, split_of,
                    stable_int)

__all__ = ["GENERALISATION_SPLITS", "WORDINGS", "COMPOSITIONS", "COUNTERFACTUAL", "counterfactual_world",
           "generalisation_splits"]

#: The splits this module builds, beside ``train``, ``validation`` and ``test``.
GENERALISATION_SPLITS = ("test_wordings", "test_composition", "test_counterfactual")
#: The ``corpus`` a counterfactual sample names.
COUNTERFACTUAL = "counterfactual"

#: Phrasings of every shipped kind that no training template uses.
WORDINGS: dict[str, tuple[str, ...]] = {
    "capital": ("Name the capital of {country}.", "{country} is governed from which city?",
                "Tell me where the government of {country} sits: which city?"),
    "country_of_capital": ("{capital} is the seat of government of which country?",
                           "Name the country that is governed from {capital}."),
    "currency": ("What money do people pay with in {country}?", "Name the official money of {country}."),
    "language": ("Name a language people speak in {country}.", "What do people in {country} speak? Give one language."),
    "region": ("{country} belongs to which part of the world?", "Name the world region that {country} belongs to."),
    "currency_via_capital": ("People in the country governed from {capital} pay with which money?",
                             "Name the money of the nation whose seat of government is {capital}."),
    "region_via_capital": ("The nation governed from {capital} belongs to which part of the world?",
                           "Name the world region of the nation whose seat of government is {capital}."),
    "capital_via_currency_border": (
        "A neighbour of {neighbour} pays with the {currency}. Which city is its seat of government?",
        "Name the seat of government of the nation next to {neighbour} whose money is the {currency}."),
}
assert set(WORDINGS) == set(KINDS)

#: Kinds whose hops occur in training only in other questions, with their hop count, and
#: their phrasings (in the training templates' style: the composition is what is new).
COMPOSITIONS: dict[str, int] = {
    "language_via_capital": 2,  # country_of_capital, then language
    "region_via_currency_border": 2,  # the clue hop of capital_via_currency_border, then region
    "language_via_currency_border": 2,  # the same clue hop, then language
}
COMPOSITION_TEMPLATES: dict[str, tuple[str, ...]] = {
    "language_via_capital": ("Which language is spoken in the country whose capital is {capital}?",
                             "What is one of the languages spoken in the country whose capital city is {capital}?"),
    "region_via_currency_border": (
        "In which region is the country that uses the {currency} and borders {neighbour}?",
        "Which world region is the country that borders {neighbour} and uses the {currency} part of?"),
    "language_via_currency_border": (
        "Which language is spoken in the country that uses the {currency} and borders {neighbour}?",
        "What is one of the languages spoken in the country that borders {neighbour} and uses the {currency}?"),
}
assert not set(COMPOSITIONS) & set(KINDS) and set(COMPOSITION_TEMPLATES) == set(COMPOSITIONS)

# What a country takes from another in the counterfactual world: each group from a donor of
# its own, so a question that names only a capital ("the currency of the country whose capital
# is Nuuk") has a changed answer too.
_COUNTERFACTUAL_FIELDS = (("capital", "capital_latlng"), ("currencies",), ("languages",), ("region", "subregion"))


def counterfactual_world(countries: list[Country]) -> list[Country]:
    """``countries`` where each takes its capital from one other country, its currencies from
    another, its languages and its region from others again: for each group, the next country
    in a fixed shuffle of all of them (a cycle, so nobody keeps their own and every capital
    still names one country). Names, borders and numbers stay."""
    changes: dict[str, dict[str, Any]] = {c.code: {} for c in countries}
    for fields in _COUNTERFACTUAL_FIELDS:
        order = sorted(countries, key=lambda c: (stable_int("counterfactual", fields[0], c.code), c.code))
        for i, c in enumerate(order):
            donor = order[(i + 1) % len(order)]
            changes[c.code].update({field: getattr(donor, field) for field in fields})
    return [dataclasses.replace(c, **changes[c.code]) for c in countries]


def _composition(countries: list[Country], where: dict[str, Any]) -> list[dict[str, Any]]:
    """The :data:`COMPOSITIONS` questions the facts support, about every country."""
    world = World.of(countries, where)
    samples: list[dict[str, Any]] = []

    def add(kind: str, subject: Country, golds: list[str], support: list[str | None], **slots: str) -> bool:
        sample = ask(kind, COMPOSITIONS[kind], subject, golds, support, COMPOSITION_TEMPLATES, "composition",
                     True, **slots)
        if sample is not None:
            samples.append(sample)
        return sample is not None

    for c in countries:
        p = where[c.code]
        if world.capital_leads_to_country(c) and c.languages:
            add("language_via_capital", c, language_answers(c), [p.capital, p.economy], capital=c.capital)
        clues = world.currency_border_clues(c) if c.currencies and c.border_codes else []
        for kind, golds, last in (("region_via_currency_border", [c.region], p.overview),
                                  ("language_via_currency_border", language_answers(c), p.economy)):
            if golds:
                for currency, other in clues:
                    if add(kind, c, golds, [p.economy, p.borders, last], currency=currency,
                           neighbour=world.by_code[other].name):
                        break
    return samples


def _real_answers(sample: dict[str, Any], real: World) -> set[str]:
    """Every answer (normalised) a model that memorised the real facts could give to
    ``sample``'s question: the real world's answer, and the real fact of the country the
    changed world's first hop leads to."""
    slots, subject = sample["slots"], real.by_code[sample["id"].rsplit("-", 1)[1]]
    kind = sample["kind"]
    if "capital" in slots:  # the country that really has that capital
        owners = [real.by_code[code] for code in real.capital_owners.get(normalize_answer(slots["capital"]), [])]
    elif "currency" in slots:  # the countries that really use that currency and border that neighbour
        neighbour = next(c.code for c in real.countries if c.name == slots["neighbour"])
        owners = [real.by_code[code] for code in real.neighbours[neighbour]
                  if slots["currency"] in real.by_code[code].currencies]
    else:
        owners = []
    if kind != "country_of_capital":  # (whose answer is the subject the changed hop finds)
        # and the subject's own real fact: a model that follows the changed first hop to the
        # subject ("Ottawa is the capital city of Algeria") but answers the second from memory
        owners.append(subject)
    answers: list[str] = []
    for owner in owners:
        answers += {"capital": [owner.capital or ""], "country_of_capital": [owner.name, *owner.aliases],
                    "currency": owner.currencies, "currency_via_capital": owner.currencies,
                    "language": language_answers(owner), "region": [owner.region],
                    "region_via_capital": [owner.region],
                    "capital_via_currency_border": [owner.capital or ""]}[kind]
    return {normalize_answer(a) for a in answers if a}


def generalisation_splits(countries: list[Country], where: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]],
                                                                                     list[dict[str, str]]]:
    """The three splits' samples (unordered) and the counterfactual corpus's rows."""
    def in_test(sample: dict[str, Any]) -> bool:
        return split_of(sample["id"].rsplit("-", 1)[1]) == "test"

    wordings = [s for s in questions(countries, where, WORDINGS, "wording", with_slots=True) if in_test(s)]
    changed = counterfactual_world(countries)
    changed_rows, changed_where = corpus_rows(changed)
    real = World.of(countries, where)
    counterfactual = []
    for sample in questions(changed, changed_where, TEMPLATES, COUNTERFACTUAL, with_slots=True):
        golds = {normalize_answer(a) for a in sample["golden_answers"]}
        if in_test(sample) and not golds & _real_answers(sample, real):
            counterfactual.append({**sample, "corpus": COUNTERFACTUAL})
    splits = {"test_wordings": wordings, "test_composition": _composition(countries, where),
              "test_counterfactual": counterfactual}
    return splits, changed_rows
