"""Fixtures of the nl2sql tests: the built-in dataset (built once per session into a
temporary directory), and small Spider- and BIRD-format directories written in exactly those
datasets' layouts, with real SQLite databases (data in ``nl2sql_testdata.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nl2sql_testdata import (BIRD_DEV, CONCERT_SQL, FINANCIAL_SQL, PETS_SQL, SPIDER_DEV, SPIDER_TRAIN, make_db,
                             write_json)
from rlfactory_nl2sql.data import build, spider_tables_entry


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """The built-in dataset, built once into a temporary directory."""
    return build(tmp_path_factory.mktemp("nl2sql") / "data")


@pytest.fixture
def spider_dir(tmp_path) -> Path:
    """A Spider-format directory: tables.json, train_spider.json, dev.json, database/<db_id>/<db_id>.sqlite."""
    root = tmp_path / "spider"
    concert = make_db(root / "database" / "concert_singer" / "concert_singer.sqlite", CONCERT_SQL)
    pets = make_db(root / "database" / "pets" / "pets.sqlite", PETS_SQL)
    write_json(root / "tables.json",
               [spider_tables_entry(concert, "concert_singer"), spider_tables_entry(pets, "pets")])
    write_json(root / "train_spider.json", SPIDER_TRAIN)
    write_json(root / "dev.json", SPIDER_DEV)
    return root


@pytest.fixture
def bird_dir(tmp_path) -> Path:
    """A BIRD-format dev directory: dev.json, dev_tables.json, dev_databases/<db_id>/<db_id>.sqlite."""
    root = tmp_path / "bird" / "dev"
    financial = make_db(root / "dev_databases" / "financial" / "financial.sqlite", FINANCIAL_SQL)
    write_json(root / "dev_tables.json", [spider_tables_entry(financial, "financial")])
    write_json(root / "dev.json", BIRD_DEV)
    return root
