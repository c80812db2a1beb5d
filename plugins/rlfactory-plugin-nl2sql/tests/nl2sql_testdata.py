"""Test data of the nl2sql tests: SQLite scripts, Spider and BIRD rows in those datasets'
formats, and small helpers. (A module of its own, not conftest.py: several test directories
of the repository have a conftest.py, and ``from conftest import`` would depend on which one
pytest imported last.)"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path


CONCERT_SQL = """
CREATE TABLE stadium (stadium_id INTEGER PRIMARY KEY, name TEXT, capacity INTEGER);
CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);
CREATE TABLE concert (concert_id INTEGER PRIMARY KEY, concert_name TEXT,
                      stadium_id INTEGER REFERENCES stadium(stadium_id), year TEXT);
INSERT INTO stadium VALUES (1, 'Stark''s Park', 10104), (2, 'Glebe Park', 4125), (3, 'Somerset Park', 11998);
INSERT INTO singer VALUES (1, 'Joe Sharp', 'Netherlands', 52), (2, 'Timbaland', 'United States', 32),
                          (3, 'Justin Brown', 'France', 29), (4, 'Rose White', 'France', 41),
                          (5, 'John Nizinik', 'France', 43), (6, 'Tribal King', 'France', 25);
INSERT INTO concert VALUES (1, 'Auditions', 1, '2014'), (2, 'Super bootcamp', 2, '2014'),
                           (3, 'Home Visits', 2, '2015'), (4, 'Week 1', 3, '2014');
"""

PETS_SQL = """
CREATE TABLE pets (pet_id INTEGER PRIMARY KEY, pet_type TEXT, pet_age INTEGER, weight REAL);
INSERT INTO pets VALUES (1, 'cat', 3, 12.0), (2, 'dog', 2, 13.4), (3, 'dog', 1, 9.3);
"""

FINANCIAL_SQL = """
CREATE TABLE account (account_id INTEGER PRIMARY KEY, district_id INTEGER, frequency TEXT, date TEXT);
CREATE TABLE loan (loan_id INTEGER PRIMARY KEY, account_id INTEGER REFERENCES account(account_id), amount INTEGER,
                   status TEXT);
INSERT INTO account VALUES (1, 18, 'POPLATEK MESICNE', '1995-03-24'), (2, 1, 'POPLATEK MESICNE', '1993-02-26'),
                           (3, 5, 'POPLATEK TYDNE', '1997-07-07');
INSERT INTO loan VALUES (1, 1, 80952, 'A'), (2, 2, 30276, 'B'), (3, 3, 318480, 'D');
"""


def make_db(path: Path, script: str) -> Path:
    """A SQLite database at ``path`` made by ``script``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.commit()
    conn.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")
    return path


SPIDER_TRAIN = [
    {"db_id": "concert_singer", "question": "How many singers do we have?",
     "query": "SELECT count(*) FROM singer", "query_toks": ["SELECT", "count", "(", "*", ")", "FROM", "singer"],
     "question_toks": ["How", "many", "singers", "do", "we", "have", "?"], "sql": {}},
    {"db_id": "concert_singer",
     "question": "Show name, country, age for all singers ordered by age from the oldest to the youngest.",
     "query": "SELECT name ,  country ,  age FROM singer ORDER BY age DESC", "query_toks": [], "question_toks": [],
     "sql": {}},
    {"db_id": "pets", "question": "Find the number of dog pets.",
     "query": "SELECT count(*) FROM pets WHERE pet_type  =  'dog'", "query_toks": [], "question_toks": [], "sql": {}},
]
SPIDER_DEV = [
    {"db_id": "concert_singer", "question": "What are the names of the stadiums with a concert in 2014?",
     "query": "SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id  =  T2.stadium_id "
              "WHERE T1.year  =  2014", "query_toks": [], "question_toks": [], "sql": {}},
    {"db_id": "pets", "question": "What is the average weight of dogs?",
     "query": "SELECT avg(weight) FROM pets WHERE pet_type = 'dog'", "query_toks": [], "question_toks": [],
     "sql": {}},
]
BIRD_DEV = [
    {"question_id": 0, "db_id": "financial", "question": "How many accounts have a weekly issuance?",
     "evidence": "'POPLATEK TYDNE' stands for weekly issuance",
     "SQL": "SELECT COUNT(account_id) FROM account WHERE frequency = 'POPLATEK TYDNE'", "difficulty": "simple"},
    {"question_id": 1, "db_id": "financial", "question": "What is the amount of the largest loan?",
     "evidence": "", "SQL": "SELECT MAX(amount) FROM loan", "difficulty": "simple"},
    {"question_id": 2, "db_id": "financial", "question": "List the loan ids in order of amount, largest first.",
     "evidence": "", "SQL": "SELECT loan_id FROM loan ORDER BY amount DESC", "difficulty": "moderate"},
]
