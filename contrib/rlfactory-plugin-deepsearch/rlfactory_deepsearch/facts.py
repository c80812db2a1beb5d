"""The facts behind the deepsearch dataset, and the passages and questions made from them.

:func:`load_countries` reads countryinfo (with pycountry's names); :func:`corpus_rows` writes
each country's passages; :func:`questions` asks every question the facts support
unambiguously, in the phrasings of a template table (:data:`TEMPLATES` for the shipped
splits). :mod:`rlfactory_deepsearch.data` builds the shipped splits from them and
:mod:`rlfactory_deepsearch.generalisation` the splits that test beyond them. Internal to the
plugin: the dataset's files are its interface.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable

from rlfactory_core import RLFactoryError, normalize_answer

__all__ = ["KINDS", "DATA_SOURCE", "TEMPLATES", "Country", "Passages", "load_countries", "corpus_rows",
           "questions", "World", "ask", "language_answers", "stable_int", "split_of", "mentions", "distinct", "with_unaccented"]

#: Question kinds and their number of retrieval hops.
KINDS: dict[str, int] = {
    "capital": 1,
    "country_of_capital": 1,
    "currency": 1,
    "language": 1,
    "region": 1,
    "currency_via_capital": 2,
    "region_via_capital": 2,
    "capital_via_currency_border": 2,
}
#: ``data_source`` of every sample (Search-R1's column of that name).
DATA_SOURCE = "countryinfo"
# Phrasings per kind; one is picked per question by a stable hash, for some variety.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "capital": ("What is the capital of {country}?", "What is the capital city of {country}?",
                "Which city is the capital of {country}?"),
    "country_of_capital": ("Which country has {capital} as its capital?",
                           "{capital} is the capital of which country?"),
    "currency": ("Which currency is used in {country}?", "What is the currency of {country}?"),
    "language": ("Which language is spoken in {country}?",
                 "What is one of the languages spoken in {country}?"),
    "region": ("In which region is {country}?", "Which world region is {country} part of?"),
    "currency_via_capital": ("What currency is used in the country whose capital is {capital}?",
                             "Which currency is used in the country whose capital city is {capital}?"),
    "region_via_capital": ("Which region is the country whose capital is {capital} in?",
                           "In which region is the country whose capital is {capital}?"),
    "capital_via_currency_border": (
        "What is the capital of the country that uses the {currency} and borders {neighbour}?",
        "Which city is the capital of the country that borders {neighbour} and uses the {currency}?"),
}
assert set(TEMPLATES) == set(KINDS)

_REGIONS = ("Africa", "Americas", "Asia", "Europe", "Oceania")
# ISO 4217 fund codes: accounting units (Bolivia's Mvdol, Chile's Unidad de Fomento, the US
# "next day" dollar ...), not the money people use; countryinfo lists them beside the currency.
_FUND_CURRENCIES = frozenset({"BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "USS", "UYI", "UYW",
                              "XDR", "XSU", "XUA"})
# countryinfo alternative spellings that do not name the country alone: "Prathet" is Thai for
# "country", "Island" Icelandic for Iceland (and an English word), "Mexicanos" and "Portuguesa"
# adjectives, "Guiana" the whole region of the Guianas, "Abode of Peace" a fragment of Brunei's
# "Nation of Brunei, the Abode of Peace".
_NOT_NAMES = frozenset({"Prathet", "Island", "Mexicanos", "Portuguesa", "Guiana", "Abode of Peace"})
# At most this many other names per country: they go into its overview passage.
_MAX_ALIASES = 4


# --------------------------------------------------------------------------- facts


@dataclass
class Country:
    """One country or territory's usable facts; every field is checked, missing ones empty."""

    code: str  # ISO 3166 alpha-3
    name: str
    aliases: list[str]  # other names, stated in the overview passage
    region: str
    subregion: str
    capital: str | None
    capital_latlng: tuple[float, float] | None
    currencies: list[str]  # names, e.g. "Euro"
    languages: list[str]  # names, e.g. "French"
    border_codes: list[str]  # alpha-3, as countryinfo lists them
    population: int | None
    area: float | None
    demonym: str | None
    iso_names: list[str]  # pycountry's names for the code

    def fact_count(self) -> int:
        return sum(bool(x) for x in (self.capital, self.currencies, self.languages, self.border_codes,
                                     self.population, self.area, self.demonym))


def _text(value: Any) -> str | None:
    """A stripped non-empty string, or None (countryinfo has "", lists and None where text belongs)."""
    return value.strip() if isinstance(value, str) and value.strip() else None


def _positive_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if value > 0 else None


def _ascii_fold(text: str) -> str:
    """``text`` without accents ("Bogotá" -> "Bogota")."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))


def mentions(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as whole words, after answer normalisation."""
    phrase = normalize_answer(phrase)
    return bool(phrase) and f" {phrase} " in f" {normalize_answer(text)} "


def _iso_codes() -> frozenset[str]:
    """Every ISO 3166 / 4217 / 639 code pycountry knows: never an acceptable answer or name."""
    import pycountry

    codes = set()
    for country in pycountry.countries:
        codes.update((country.alpha_2, country.alpha_3))
    codes.update(currency.alpha_3 for currency in pycountry.currencies)
    for language in pycountry.languages:
        codes.update(getattr(language, attr) for attr in ("alpha_2", "alpha_3") if hasattr(language, attr))
    return frozenset(codes)


def _is_code(text: str, codes: frozenset[str]) -> bool:
    return text in codes or (text.isupper() and text.lower() in codes)


def _currency_name(code: Any) -> str | None:
    import pycountry

    if not isinstance(code, str) or code in _FUND_CURRENCIES:
        return None
    # Codes pycountry no longer lists are withdrawn currencies (HRK, VEF, ZMK ...): dated facts.
    currency = pycountry.currencies.get(alpha_3=code)
    return currency.name if currency else None


def _language_name(code: Any) -> str | None:
    import pycountry

    if not isinstance(code, str) or len(code) not in (2, 3) or not code.islower():
        return None  # countryinfo sometimes has names ("English") or odd codes ("rs")
    language = pycountry.languages.get(**{"alpha_2" if len(code) == 2 else "alpha_3": code})
    if language is None:
        return None
    # ISO qualifiers are not part of the name people use: "Malay (macrolanguage)" -> "Malay".
    return language.name.split(" (")[0].strip()


def _iso_names(code: str) -> list[str]:
    import pycountry

    country = pycountry.countries.get(alpha_3=code)
    if country is None:
        return []
    names = (getattr(country, attr, None) for attr in ("common_name", "official_name", "name"))
    return [name for name in names if name]


def _parse_country(raw: dict[str, Any]) -> Country | None:
    """A usable record from one countryinfo entry, or None when it lacks the basics (a current
    ISO code, a name, a region, two facts): withdrawn codes (Serbia and Montenegro), non-countries
    (Scotland) and stubs drop out here. The stubs' few facts are often wrong (Bouvet Island, in
    the South Atlantic, is listed in the Americas)."""
    name = _text(raw.get("name"))
    iso = raw.get("ISO") if isinstance(raw.get("ISO"), dict) else {}
    code = _text(iso.get("alpha3"))
    if name is None or code is None:
        return None
    iso_names = _iso_names(code)
    region, subregion = _text(raw.get("region")), _text(raw.get("subregion"))
    if not iso_names or region not in _REGIONS or subregion is None:
        return None
    capital = _text(raw.get("capital"))
    if capital is not None and "/" in capital:  # "Kralendijk / Oranjestad / The Bottom": several
        capital = None
    latlng = raw.get("capital_latlng")
    capital_latlng = None
    if (capital and isinstance(latlng, list) and len(latlng) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in latlng)):
        capital_latlng = (float(latlng[0]), float(latlng[1]))
    currencies = [n for n in map(_currency_name, raw.get("currencies") or []) if n]
    languages = [n for n in map(_language_name, raw.get("languages") or []) if n]
    borders = [c for c in raw.get("borders") or [] if isinstance(c, str) and len(c) == 3 and c.isupper()]
    population = _positive_number(raw.get("population"))
    demonym = _text(raw.get("demonym"))
    country = Country(
        code=code, name=name, aliases=[], region=region, subregion=subregion, capital=capital,
        capital_latlng=capital_latlng, currencies=list(dict.fromkeys(currencies)),
        languages=list(dict.fromkeys(languages)), border_codes=list(dict.fromkeys(borders)),
        population=int(population) if population else None, area=_positive_number(raw.get("area")),
        # "Antiguan,Barbudan": two demonyms in one field.
        demonym=" or ".join(part.strip() for part in demonym.split(",")) if demonym else None,
        iso_names=iso_names,
    )
    return country if country.fact_count() >= 2 else None


def _alias_candidates(country: Country, entries: list[dict[str, Any]], codes: frozenset[str]) -> list[str]:
    """Other names of a country: ISO's English names first, then the names and alternative
    spellings of its countryinfo entries (``entries``, the kept one first) that are names: no
    codes, no "Bolivia, Plurinational State of" inversions or parentheses, no native scripts or
    demonyms."""
    spellings = [raw.get("name") for raw in entries[1:]]
    spellings += [s for raw in entries for s in raw.get("altSpellings") or []]
    spellings = [s for s in spellings if isinstance(s, str)]
    candidates = []
    # "Cocos (Keeling) Islands" is also "Cocos Islands".
    for text in country.iso_names + [re.sub(r"\s*\([^)]*\)", "", country.name)] + spellings:
        text = text.strip()
        if text.startswith("the "):
            text = text[4:]  # "the State of Palestine"
        ok = (len(text) > 2 and text[0].isupper() and not any(ch in text for ch in ",()") and text not in _NOT_NAMES
              and not _is_code(text, codes) and text != country.demonym
              and (text in country.iso_names or text.isascii()))
        if ok and normalize_answer(text) != normalize_answer(country.name):
            candidates.append(text)
    return list(dict.fromkeys(candidates))


def load_countries() -> list[Country]:
    """Every usable country, one per ISO code, sorted by name, with aliases that name no other."""
    from countryinfo import CountryInfo

    codes = _iso_codes()
    by_code: dict[str, list[tuple[Country, dict[str, Any]]]] = {}
    everything = CountryInfo.all()
    for key in sorted(everything):
        raw = everything[key]
        country = _parse_country(raw)
        if country is not None:
            by_code.setdefault(country.code, []).append((country, raw))
    countries: list[Country] = []
    raws: dict[str, list[dict[str, Any]]] = {}
    for code, entries in by_code.items():
        # Two entries for one code (Burma and Myanmar, two Palestines): keep the facts of the
        # one with the most, then of the one named as ISO names it; the names of all are aliases.
        entries.sort(key=lambda e: (e[0].fact_count(), e[0].name in e[0].iso_names, e[0].name), reverse=True)
        countries.append(entries[0][0])
        raws[code] = [raw for _, raw in entries]
    countries.sort(key=lambda c: (c.name, c.code))
    names = [normalize_answer(c.name) for c in countries]
    if len(set(names)) != len(names):
        raise RLFactoryError("countryinfo lists two countries under one name",
                             hint="pin the countryinfo version this package was tested with (1.0.1)")

    # An alias that two countries share, or that is another country's name, names neither.
    candidates = {c.code: _alias_candidates(c, raws[c.code], codes) for c in countries}
    owners: dict[str, set[str]] = {}
    for country in countries:
        owners.setdefault(normalize_answer(country.name), set()).add(country.code)
        for alias in candidates[country.code]:
            owners.setdefault(normalize_answer(alias), set()).add(country.code)
    known = {c.code for c in countries}
    for country in countries:
        unique = [a for a in candidates[country.code] if len(owners[normalize_answer(a)]) == 1]
        country.aliases = distinct(unique)[:_MAX_ALIASES]
        country.border_codes = [code for code in country.border_codes if code in known and code != country.code]
    return countries


def distinct(texts: Iterable[str]) -> list[str]:
    """``texts`` without repeats under answer normalisation, first spelling kept."""
    seen, kept = set(), []
    for text in texts:
        key = normalize_answer(text)
        if key and key not in seen:
            seen.add(key)
            kept.append(text)
    return kept


def with_unaccented(texts: Iterable[str]) -> list[str]:
    """Each answer followed by its unaccented spelling, when that differs ("Bogotá", "Bogota")."""
    out = []
    for text in texts:
        out.append(text)
        folded = _ascii_fold(text)
        if folded != text and folded.isascii():
            out.append(folded)
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------- corpus


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _coordinates(lat: float, lng: float) -> str:
    return f"{abs(lat):.2f}° {'N' if lat >= 0 else 'S'}, {abs(lng):.2f}° {'E' if lng >= 0 else 'W'}"


@dataclass
class Passages:
    """Corpus ids of one country's passages (None where it has no such facts)."""

    overview: str
    capital: str | None = None
    economy: str | None = None
    borders: str | None = None


def corpus_rows(countries: list[Country]) -> tuple[list[dict[str, str]], dict[str, Passages]]:
    """wiki-18 rows for every country, in a fixed order, and where each country's facts are."""
    rows: list[dict[str, str]] = []
    names = {c.code: c.name for c in countries}
    country_names = {normalize_answer(c.name) for c in countries}

    def add(title: str, sentences: list[str]) -> str:
        text = " ".join(sentences)
        passage_id = str(len(rows))
        rows.append({"id": passage_id, "contents": f'"{title}"\n{text}'})
        return passage_id

    where: dict[str, Passages] = {}
    for c in countries:
        # "region" beside the answer of the region questions: "Peru lies in the Americas region".
        region = "the Americas" if c.region == "Americas" else f"the {c.region}"
        sentences = [f"{c.name} lies in {region} region, in {c.subregion}."]
        if c.aliases:
            sentences.append(f"It is also known as {_join(c.aliases)}.")
        if c.demonym:
            sentences.append(f"Its demonym is {c.demonym}.")
        passages = Passages(overview=add(c.name, sentences))
        if c.capital:
            # A city named like a country ("Singapore") gets a title of its own.
            title = f"{c.capital} (city)" if normalize_answer(c.capital) in country_names else c.capital
            sentences = [f"{c.capital} is the capital city of {c.name}."]
            if c.capital_latlng:
                sentences.append(f"It lies at {_coordinates(*c.capital_latlng)}.")
            passages.capital = add(title, sentences)
        sentences = []
        if c.currencies:
            noun = "currency" if len(c.currencies) == 1 else "currencies"
            sentences.append(f"{c.name} uses {_join([f'the {n}' for n in c.currencies])} as its {noun}.")
        if c.languages:
            sentences.append(f"Languages spoken in {c.name} include {_join(c.languages)}.")
        if sentences:
            passages.economy = add(c.name, sentences)
        if c.border_codes:
            neighbours = [names[code] for code in c.border_codes]
            passages.borders = add(c.name, [f"{c.name} shares land borders with {_join(neighbours)}."])
        sentences = []
        if c.population:
            sentences.append(f"{c.name} has a population of about {_number(c.population)} people.")
        if c.area:
            sentences.append(f"It covers an area of {_number(c.area)} square kilometres.")
        if sentences:
            add(c.name, sentences)
        where[c.code] = passages
    return rows, where


# --------------------------------------------------------------------------- questions


def stable_int(*parts: str) -> int:
    """A hash that is the same on every machine and Python version (``hash()`` is salted)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


def split_of(country_code: str) -> str:
    bucket = stable_int("split", country_code) % 10
    return "train" if bucket < 7 else "validation" if bucket < 8 else "test"


@dataclass
class World:
    """The countries with what links them: where each one's passages are, which country a
    capital names, and who borders whom (either side listing the other)."""

    countries: list[Country]
    where: dict[str, Passages]
    by_code: dict[str, Country]
    capital_owners: dict[str, list[str]]
    neighbours: dict[str, set[str]]

    @classmethod
    def of(cls, countries: list[Country], where: dict[str, Passages]) -> "World":
        capital_owners: dict[str, list[str]] = {}
        for c in countries:
            if c.capital:
                capital_owners.setdefault(normalize_answer(c.capital), []).append(c.code)
        neighbours: dict[str, set[str]] = {c.code: set() for c in countries}
        for c in countries:  # "A borders B" is in the corpus if either lists the other
            for other in c.border_codes:
                neighbours[c.code].add(other)
                neighbours[other].add(c.code)
        return cls(countries, where, {c.code: c for c in countries}, capital_owners, neighbours)

    def capital_leads_to_country(self, c: Country) -> bool:
        """Whether naming ``c``'s capital names ``c``: the capital is one country's and not part
        of its name ("Vatican City State" of "Holy See (Vatican City State)")."""
        names = [c.name] + c.aliases
        return (bool(c.capital) and len(self.capital_owners[normalize_answer(c.capital)]) == 1
                and not any(mentions(name, c.capital) for name in names))

    def currency_border_clues(self, c: Country) -> list[tuple[str, str]]:
        """``(currency, neighbour code)`` pairs that single ``c`` out: it uses the currency and
        borders the neighbour, and no other country does both; in a stable shuffled order."""
        clues = [(currency, other) for currency in c.currencies for other in c.border_codes
                 if {code for code in self.neighbours[other] if currency in self.by_code[code].currencies} == {c.code}]
        clues.sort(key=lambda clue: stable_int("clue", c.code, *clue))
        return clues


def ask(kind: str, hops: int, subject: Country, golds: list[str], support: list[str | None],
        templates: dict[str, tuple[str, ...]], id_prefix: str = DATA_SOURCE, with_slots: bool = False,
        **slots: str) -> dict[str, Any] | None:
    """The sample asking ``kind`` about ``subject`` (a phrasing of ``templates[kind]``, picked
    by a stable hash), or None when it would give its answer away. ``with_slots``: the sample
    keeps the names its question states (``slots``: ``country``, ``capital``, ``currency``,
    ``neighbour``), for splits whose phrasings no pattern knows."""
    phrasings = templates[kind]
    question = phrasings[stable_int("template", kind, subject.code) % len(phrasings)].format(**slots)
    golds = distinct(with_unaccented(golds))
    # A question that contains its answer tests nothing ("In which region is South Africa?");
    # a multi-hop one must not name the country it bridges through, nor its people ("the
    # country whose capital is Kuwait City", "... that uses the Iraqi Dinar"), and the
    # country's name must not give the answer away ("... whose capital is Pretoria": Africa).
    names = [subject.name] + subject.aliases
    leaks = list(golds)
    if hops > 1:
        leaks += names + (subject.demonym or "").split(" or ")
        if any(mentions(name, gold) for name in names for gold in golds):
            return None
    if not golds or any(mentions(question, text) for text in leaks):
        return None
    sample = {
        "id": f"{id_prefix}-{kind}-{subject.code}",
        "question": question,
        "golden_answers": golds,
        "answer": golds[0],
        "hops": hops,
        "kind": kind,
        "data_source": DATA_SOURCE,
        "entity": subject.name,
        "supporting_ids": [s for s in support if s is not None],
    }
    return {**sample, "slots": dict(slots)} if with_slots else sample


def language_answers(c: Country) -> list[str]:
    """Accepted answers to "which language is spoken in ``c``": "Modern Greek" (ISO's name) is Greek."""
    return [a for name in c.languages for a in (name, name.removeprefix("Modern "))]


def questions(countries: list[Country], where: dict[str, Passages], templates: dict[str, tuple[str, ...]] = TEMPLATES,
              id_prefix: str = DATA_SOURCE, with_slots: bool = False) -> list[dict[str, Any]]:
    """Every question of :data:`KINDS` the facts support unambiguously, in a fixed order, in
    the phrasings of ``templates`` (see :func:`ask` for ``with_slots``)."""
    world = World.of(countries, where)
    samples: list[dict[str, Any]] = []

    def add(kind: str, subject: Country, golds: list[str], support: list[str | None], **slots: str) -> bool:
        sample = ask(kind, KINDS[kind], subject, golds, support, templates, id_prefix, with_slots, **slots)
        if sample is not None:
            samples.append(sample)
        return sample is not None

    for c in countries:
        p = where[c.code]
        names = [c.name] + c.aliases
        capital_leads_to_country = world.capital_leads_to_country(c)
        if c.capital:
            add("capital", c, [c.capital], [p.capital], country=c.name)
        if capital_leads_to_country:
            add("country_of_capital", c, names, [p.capital], capital=c.capital)
        if c.currencies:
            add("currency", c, c.currencies, [p.economy], country=c.name)
        if c.languages:
            add("language", c, language_answers(c), [p.economy], country=c.name)
        add("region", c, [c.region], [p.overview], country=c.name)
        if capital_leads_to_country and c.currencies:
            add("currency_via_capital", c, c.currencies, [p.capital, p.economy], capital=c.capital)
        if capital_leads_to_country:
            add("region_via_capital", c, [c.region], [p.capital, p.overview], capital=c.capital)
        if c.capital and c.currencies and c.border_codes:
            # One question per country, from the first pair of clues that does not give the
            # country away.
            for currency, other in world.currency_border_clues(c):
                if add("capital_via_currency_border", c, [c.capital], [p.economy, p.borders, p.capital],
                       currency=currency, neighbour=world.by_code[other].name):
                    break
    return samples
