"""Regenerates tests/data, the reference vectors the tests compare against, with PyTorch and
Hugging Face transformers (the modules in scripts/test_data/ say how each file is made).

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers safetensors numpy
    /tmp/ref/bin/python scripts/make_test_data.py [MINILM_DIR] [PART...]

PARTS are among sdpa, mha, grad, minilm, tiny-gpt2, heads, contributions, gradients, decoders, seq2seq and
seq2seq-truncation (what seq2seq writes to s2s/truncation.json alone; all by
default; heads reads tiny-gpt2's tokenizer and weights, contributions and gradients the heads'
checkpoints). MINILM_DIR is a local all-MiniLM-L6-v2 in the Hugging Face layout; by default the copy
attnscope fetched into its cache ($ATTNSCOPE_CACHE, else $XDG_CACHE_HOME/attnscope, else
~/.cache/attnscope). The files are rewritten in place: new random inputs mean new expected
values, so commit them together.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "test_data"))

import golden  # noqa: E402
import model_golden  # noqa: E402
import contributions  # noqa: E402
import gradients  # noqa: E402
import task_heads  # noqa: E402
import decoders  # noqa: E402
import seq2seq  # noqa: E402

PARTS = ["sdpa", "mha", "grad", "minilm", "tiny-gpt2", "heads", "contributions", "gradients",
         "decoders", "seq2seq", "seq2seq-truncation"]


def default_minilm():
    cache = os.environ.get("ATTNSCOPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attnscope")
    return os.path.join(cache, "all-MiniLM-L6-v2")


def main():
    args = sys.argv[1:]
    minilm_dir = args.pop(0) if args and args[0] not in PARTS else default_minilm()
    parts = args or PARTS
    if unknown := [p for p in parts if p not in PARTS]:
        sys.exit(f"error: unknown part {unknown[0]!r} (parts: {', '.join(PARTS)})")
    if not os.path.isfile(os.path.join(minilm_dir, "model.safetensors")):
        sys.exit(f"error: {minilm_dir} holds no model.safetensors: run attnscope once to fetch "
                 "the default model, or give the directory of all-MiniLM-L6-v2")
    root = os.path.join(here, "..", "tests", "data")
    if "sdpa" in parts:
        print("sdpa", golden.sdpa_cases(os.path.join(root, "sdpa"), 0, []))
    if "mha" in parts:
        print("mha", golden.mha_cases(os.path.join(root, "mha"), 1))
    if "grad" in parts:
        print("grad", golden.grad_cases(os.path.join(root, "grad"), 2))
    if "minilm" in parts:
        model_golden.minilm(minilm_dir, os.path.join(root, "minilm"), model_golden.SEED_TEXTS,
                            [["The cat sat", "The cat that ate the mouse ran away", "Hello"]])
    if "tiny-gpt2" in parts:
        model_golden.tiny_gpt2(os.path.join(root, "tiny-gpt2"),
                               ["The cat sat on the mat", "Where is the Eiffel Tower?"], 0)
    if "heads" in parts:
        task_heads.heads(minilm_dir, os.path.join(root, "heads"), os.path.join(root, "tiny-gpt2"))
    if "contributions" in parts:
        contributions.all_models(minilm_dir, os.path.join(root, "heads"), os.path.join(root, "contributions"))
    if "gradients" in parts:
        gradients.all_models(minilm_dir, os.path.join(root, "heads"), os.path.join(root, "tiny-gpt2"),
                             os.path.join(root, "gradients"))
    if "decoders" in parts:
        decoders.main(root)
    if "seq2seq" in parts:
        seq2seq.main(root)
    elif "seq2seq-truncation" in parts:
        seq2seq.truncation(root)


if __name__ == "__main__":
    main()
