"""The facts of the built-in nl2sql data: every usable country of ``countryinfo`` (names from
``pycountry``), and the stable hashes and fill-ins the question builders share.

Entries without a current ISO code, a world region and a subregion are left out, as are
withdrawn currencies and ISO fund codes; a country needs two facts at least.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from .sqltext import normalise_sql, sql_string

__all__ = ["Country", "REGIONS", "NUMBER_SLOTS", "load_countries", "perturbed", "stable_int", "split_of",
           "question_text", "gold_sql"]
#: Question slots that hold numbers (shown as 10,000,000, written into the SQL unquoted).
NUMBER_SLOTS = frozenset({"threshold", "count", "area"})
#: The world regions of countryinfo a country must be in.
REGIONS = ("Africa", "Americas", "Asia", "Europe", "Oceania")
# ISO 4217 fund codes: accounting units countryinfo lists beside the money people use.
_FUND_CURRENCIES = frozenset({"BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "USS", "UYI", "UYW",
                              "XDR", "XSU", "XUA"})


@dataclass
class Country:
    code: str
    name: str
    region: str
    subregion: str
    population: int | None
    area: float | None
    capital: str | None
    latitude: float | None
    longitude: float | None
    currencies: list[tuple[str, str]]  # (code, name)
    languages: list[tuple[str, str]]
    borders: list[str]

    def fact_count(self) -> int:
        return sum(bool(x) for x in (self.population, self.area, self.capital, self.currencies, self.languages,
                                     self.borders))


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 else None


def _currency(code: Any) -> tuple[str, str] | None:
    import pycountry

    if not isinstance(code, str) or code in _FUND_CURRENCIES:
        return None
    currency = pycountry.currencies.get(alpha_3=code)  # absent: withdrawn (HRK, VEF ...)
    return (currency.alpha_3, currency.name) if currency else None


def _language(code: Any) -> tuple[str, str] | None:
    import pycountry

    if not isinstance(code, str) or len(code) not in (2, 3) or not code.islower():
        return None
    language = pycountry.languages.get(**{"alpha_2" if len(code) == 2 else "alpha_3": code})
    if language is None:
        return None
    return code, language.name.split(" (")[0].strip()  # "Malay (macrolanguage)" -> "Malay"


def _parse(raw: dict[str, Any]) -> Country | None:
    import pycountry

    name = _text(raw.get("name"))
    iso = raw.get("ISO") if isinstance(raw.get("ISO"), dict) else {}
    code = _text(iso.get("alpha3"))
    region, subregion = _text(raw.get("region")), _text(raw.get("subregion"))
    if not name or not code or region not in REGIONS or not subregion:
        return None
    if pycountry.countries.get(alpha_3=code) is None:  # withdrawn codes, non-countries
        return None
    capital = _text(raw.get("capital"))
    if capital and "/" in capital:  # "Kralendijk / Oranjestad / The Bottom": several
        capital = None
    latlng = raw.get("capital_latlng")
    latitude = longitude = None
    if capital and isinstance(latlng, list) and len(latlng) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in latlng):
        latitude, longitude = round(float(latlng[0]), 4), round(float(latlng[1]), 4)
    population = _positive(raw.get("population"))
    country = Country(
        code=code, name=name, region=region, subregion=subregion,
        population=int(population) if population else None, area=_positive(raw.get("area")),
        capital=capital, latitude=latitude, longitude=longitude,
        currencies=list(dict.fromkeys(c for c in map(_currency, raw.get("currencies") or []) if c)),
        languages=list(dict.fromkeys(lang for lang in map(_language, raw.get("languages") or []) if lang)),
        borders=list(dict.fromkeys(c for c in raw.get("borders") or []
                                   if isinstance(c, str) and len(c) == 3 and c.isupper())),
    )
    return country if country.fact_count() >= 2 else None


def load_countries() -> list[Country]:
    """Every usable country, one per ISO code and one per name, sorted by code."""
    from countryinfo import CountryInfo

    everything = CountryInfo.all()
    by_code: dict[str, list[Country]] = {}
    for key in sorted(everything):
        country = _parse(everything[key])
        if country is not None:
            by_code.setdefault(country.code, []).append(country)
    countries, names = [], set()
    for code in sorted(by_code):
        # Two entries for one code (Burma and Myanmar): the one with the most facts.
        best = sorted(by_code[code], key=lambda c: (-c.fact_count(), c.name))[0]
        if best.name.lower() not in names:
            names.add(best.name.lower())
            countries.append(best)
    known = {c.code for c in countries}
    for country in countries:
        country.borders = [b for b in country.borders if b in known and b != country.code]
    return countries


def stable_int(*parts: str) -> int:
    """A hash that is the same on every machine and Python version (``hash()`` is salted)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


def split_of(sample_id: str) -> str:
    """A question's split by a stable hash of its id: train 70%, validation 10%, test 20%."""
    bucket = stable_int("split", sample_id) % 10
    return "train" if bucket < 7 else "validation" if bucket < 8 else "test"


def question_text(template: str, slots: dict[str, str]) -> str:
    """A question from its template: numbers shown with thousands separators (10,000,000)."""
    shown = {k: (f"{int(v):,}" if k in NUMBER_SLOTS else v) for k, v in slots.items()}
    return template.format(**shown)


def gold_sql(template: str, slots: dict[str, str]) -> str:
    """A gold SQL from its template: names as SQL strings, numbers as they are, normalised."""
    literals = {k: (v if k in NUMBER_SLOTS else sql_string(v)) for k, v in slots.items()}
    return normalise_sql(template.format(**literals))


def perturbed(countries: list[Country]) -> list[Country]:
    """The same countries (codes and names) with other facts: the check database's.

    A question names its country, region, currency ... as the real database spells them, so
    every name stays; what is true of them changes. Populations, areas and capitals (with
    their coordinates) move round a cycle of the countries that have one (each value stays
    unique, so a top-k question stays decided); region and subregion, currencies and
    languages are those of a country drawn by a hash (with replacement, so counts change);
    the border graph is relabelled by a cycle of all countries. Deterministic."""
    def cycle(salt: str, pool: list[Country]) -> dict[str, Country]:
        order = sorted(pool, key=lambda c: (stable_int(salt, c.code), c.code))
        return {order[i].code: order[(i + 1) % len(order)] for i in range(len(order))}

    def drawn(salt: str, country: Country) -> Country:
        return countries[stable_int(salt, country.code) % len(countries)]

    population = cycle("population", [c for c in countries if c.population])
    area = cycle("area", [c for c in countries if c.area])
    capital = cycle("capital", [c for c in countries if c.capital])
    relabel = {code: c.code for code, c in cycle("borders", countries).items()}
    out: dict[str, Country] = {}
    for c in countries:
        place, moved_capital = drawn("place", c), capital.get(c.code)
        out[c.code] = Country(
            code=c.code, name=c.name, region=place.region, subregion=place.subregion,
            population=population[c.code].population if c.code in population else None,
            area=area[c.code].area if c.code in area else None,
            capital=moved_capital.capital if moved_capital else None,
            latitude=moved_capital.latitude if moved_capital else None,
            longitude=moved_capital.longitude if moved_capital else None,
            currencies=list(drawn("currencies", c).currencies), languages=list(drawn("languages", c).languages),
            borders=[])
    for c in countries:
        out[relabel[c.code]].borders += [relabel[b] for b in c.borders]
    for c in out.values():
        c.borders = sorted(set(c.borders))
    return [out[c.code] for c in countries]
