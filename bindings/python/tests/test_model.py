"""attnscope.Model against the reference values of all-MiniLM-L6-v2 and tiny GPT-2."""

import json
import os
import pathlib
import re
import subprocess

import numpy as np
import pytest

import attnscope
from conftest import DATA, read_safetensors


@pytest.fixture(scope="module")
def minilm():
    return attnscope.Model()


def test_attentions_and_embedding_match_transformers(minilm):
    for path in sorted((DATA / "minilm").glob("text*.safetensors")):
        t, meta = read_safetensors(path)
        got = minilm.attentions(meta["text"], meta.get("text_pair"))
        assert got.tokens == meta["tokens"], path.name
        assert got.weights.shape == t["attentions"].shape
        assert np.abs(got.weights - t["attentions"]).max() <= 1e-4, path.name
        if meta.get("text_pair") is None:
            emb = minilm.embed(meta["text"])
            assert emb.shape == (1, 384)
            assert np.abs(emb[0] - t["embedding"]).max() <= 1e-4, path.name


def test_embed_many_and_tokenize(minilm):
    texts = ["The cat sat on the mat", "Where is the Eiffel Tower?"]
    emb = minilm.embed(texts)
    assert emb.shape == (2, 384)
    assert np.allclose(emb[1], minilm.embed(texts[1])[0], atol=1e-5)
    assert minilm.tokenize("The cat")[0] == "[CLS]"


def attnscope_binary():
    """The command line built beside the package: $ATTNSCOPE_BIN, else target/{debug,release}."""
    root = pathlib.Path(__file__).resolve().parents[3]
    candidates = [os.environ.get("ATTNSCOPE_BIN")] + [str(root / "target" / p / "attnscope")
                                                      for p in ("debug", "release")]
    for c in candidates:
        if c and pathlib.Path(c).is_file():
            return c
    pytest.fail("the attnscope command line is not built (cargo build), or set ATTNSCOPE_BIN")


def test_explain_is_the_cli_json(minilm):
    text = "The cat that ate the mouse ran away"
    got = minilm.explain(text, focus="ran")
    cli = json.loads(subprocess.run([attnscope_binary(), "explain", text, "--focus", "ran", "--json"],
                                    check=True, capture_output=True, text=True).stdout)
    assert got == cli
    assert got["focus"] == "ran"
    assert [r["word"] for r in got["rows"]] == ["The", "cat", "that", "ate", "the", "mouse", "ran", "away"]
    layer = minilm.explain(text, focus="cat", layer=2, head=3, tokens=True)
    cli = json.loads(subprocess.run([attnscope_binary(), "explain", text, "--focus", "cat", "--layer", "2",
                                     "--head", "3", "--tokens", "--json"],
                                    check=True, capture_output=True, text=True).stdout)
    assert layer == cli


def test_the_explorer_shows_inline_without_the_network(minilm):
    html = minilm.attentions("The cat sat on the mat")._repr_html_()
    assert html.startswith("<iframe srcdoc=")
    assert not re.search(r"(src|href)=\\?&quot;https?:", html)
    assert "https://" not in html and "http://" not in html
    page = minilm.attentions("The cat").html()
    assert "attnscope-data" in page


def test_generate_on_tiny_gpt2():
    model = attnscope.Model(str(DATA / "tiny-gpt2"))
    text = model.generate("the cat", max_new_tokens=5)
    assert isinstance(text, str) and text
    assert model.n_layers == 2 and model.n_heads == 4


def test_errors_are_value_errors(minilm, tmp_path):
    with pytest.raises(ValueError, match='no word "dog"'):
        minilm.explain("The cat sat", focus="dog")
    with pytest.raises(ValueError, match=str(tmp_path / "nowhere")):
        attnscope.Model(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="decoder|causal"):
        minilm.generate("The cat")
    with pytest.raises(ValueError, match="512"):
        minilm.attentions("word " * 600)
    with pytest.raises(ValueError, match="head needs a layer"):
        minilm.explain("The cat", focus="cat", head=1)
    with pytest.raises(ValueError, match="give layer or rollout, not both"):
        minilm.explain("The cat", focus="cat", layer=1, rollout=True)


def test_the_inline_explorer_draws_in_a_browser(minilm, tmp_path):
    from webdriver import Browser
    att = minilm.attentions("The cat sat on the mat")
    cell = tmp_path / "notebook.html"
    # What a notebook does with _repr_html_: the markup inside the output cell's element.
    cell.write_text(f"<!DOCTYPE html><html><body><div class='output'>{att._repr_html_()}</div></body></html>")
    browser = Browser()
    try:
        browser.goto(cell.as_uri())
        browser.frame(0)
        assert browser.wait_for("return document.body.dataset.state === 'ready'"), browser.run(
            "return [document.body.dataset.state, document.getElementById('error').textContent]")
        shown = browser.run("return [...document.querySelectorAll('#view-head .tok')].map((t) => t.textContent)")
        assert shown[:len(att.tokens)] == att.tokens
        browser.run("document.querySelector('#tabs button[data-view=heatmap]').click()")
        assert browser.wait_for("return document.body.dataset.state === 'ready' && "
                                "!document.getElementById('view-heatmap').hidden")
    finally:
        browser.close()
