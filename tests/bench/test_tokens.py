"""Client token counts: the 4-characters estimate, and a local tokenizer.json for exact prompt lengths."""

import random
import sys

import pytest

from tokwatch.bench.workload import WorkloadError
from tokwatch.figures.tokens import CharEstimate, HFTokenizer, token_counter


def test_estimate_without_a_tokenizer():
    est = token_counter(None)
    assert isinstance(est, CharEstimate)
    assert est.count("") == 0 and est.count("abcdefgh") == 2
    assert len(est.text_of(25, random.Random(1)).split()) == 25


def test_tokenizer_builds_prompts_of_exact_token_length(tokenizer_json):
    tok = HFTokenizer(tokenizer_json)
    rng = random.Random(3)
    for n in (1, 2, 7, 64, 333, 2000):
        text = tok.text_of(n, rng)
        assert tok.count(text) == n, (n, text[:80])
    # The word estimate would be wrong here: most common words are several tokens in this tiny vocabulary.
    plain = " ".join(["people"] * 10)
    assert tok.count(plain) != 10
    assert token_counter(tokenizer_json) is token_counter(tokenizer_json)  # loaded once per process


def test_bad_tokenizer_file_is_a_clear_error(tmp_path):
    pytest.importorskip("tokenizers")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(WorkloadError, match=r"tokenizer\.json: cannot load as a HuggingFace tokenizer\.json"):
        HFTokenizer(str(bad))
    with pytest.raises(WorkloadError, match="cannot load"):
        HFTokenizer(str(tmp_path / "missing.json"))


def test_missing_tokenizers_package_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
    wanted = r"needs the tokenizers package: pip install 'tokwatch\[tokenizer\]'"
    with pytest.raises(WorkloadError, match=wanted):
        HFTokenizer(str(tmp_path / "tokenizer.json"))
