"""Integrated gradients' speed: `attnscope bench attribute --method ig` against Captum's
`LayerIntegratedGradients` on the word-embedding layer, on all-MiniLM-L6-v2, a 25-token sentence,
the target its cosine with another sentence's embedding, 50 Gauss–Legendre points in one batch,
the same threads, alternating, in the same run.

usage: python scripts/bench_attribute.py [--model DIR] [--threads 2] [--reps 5] [--rounds 3]
       (after: cargo build --release -p attnscope)

DIR defaults to the default model where attnscope caches it ($ATTNSCOPE_CACHE, else
$XDG_CACHE_HOME/attnscope, else ~/.cache/attnscope; `attnscope explain "x" --focus x` fetches it).
Captum's baseline is the [PAD] token, whose word embedding the script sets to zero (the text
has no [PAD], so nothing else changes): the same baseline as attnscope's (no word embeddings,
position and token-type embeddings kept).
Each round prints both sides' median ms after load and the ratio; the scores of both are
compared once (they agree to about 1e-4: Captum sums the same Gauss–Legendre points).
Also times attnscope's forward pass and input × gradient, for scale.
"""
import argparse, json, os, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "target", "release", "attnscope")
# 23 WordPiece tokens, 25 with [CLS] and [SEP].
TEXT = "The cat that ate the mouse that lived in the old barn by the river ran away when the farmer came home late"
TARGET_TEXT = "A dog lay on the rug"
STEPS = 50


def default_model():
    cache = os.environ.get("ATTNSCOPE_CACHE")
    if not cache:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        cache = os.path.join(xdg, "attnscope")
    return os.path.join(cache, "all-MiniLM-L6-v2")


def ours(model_dir, method, threads, reps):
    out = subprocess.run(
        [OURS, "bench", "attribute", "--method", method, "--text", TEXT, "--target-text", TARGET_TEXT,
         "--steps", str(STEPS), "--reps", str(reps), "--model", model_dir, "--threads", str(threads),
         "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def captum_setup(model_dir, threads):
    import torch
    from captum.attr import LayerIntegratedGradients
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    assert ids.shape[1] == 25, ids.shape
    pad = tok.pad_token_id
    assert pad not in ids[0].tolist()
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[pad] = 0.0
    with torch.no_grad():
        goal = model(**tok(TARGET_TEXT, return_tensors="pt")).last_hidden_state[0].mean(0)

    def forward(input_ids):
        u = model(input_ids=input_ids).last_hidden_state.mean(1)
        return torch.nn.functional.cosine_similarity(u, goal[None], dim=-1)

    lig = LayerIntegratedGradients(forward, model.embeddings.word_embeddings)
    baseline = torch.full_like(ids, pad)

    def run():
        attr, gap = lig.attribute(ids, baselines=baseline, n_steps=STEPS, method="gausslegendre",
                                  internal_batch_size=STEPS, return_convergence_delta=True)
        return attr[0].sum(-1).detach().numpy(), float(gap.abs())

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not os.path.isfile(OURS):
        sys.exit(f"{OURS} is missing: run cargo build --release -p attnscope first")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        sys.exit(f"{args.model}: no config.json (run `attnscope explain \"x\" --focus x` to fetch the default model)")
    captum = captum_setup(args.model, args.threads)
    scores, gap = captum()
    mine = ours(args.model, "ig", args.threads, 1)
    diff = max(abs(a - b) for a, b in zip(mine["scores"], scores))
    scale = max(abs(b) for b in scores)
    print(f"{mine['model']}, {mine['tokens']} tokens, {STEPS} Gauss–Legendre points, {args.threads} threads")
    print(f"scores: attnscope against Captum, max |difference| {diff:.2e} of max |score| {scale:.3f}; "
          f"Captum's completeness gap {gap:.2e}")
    for method in ("forward", "grad-input"):
        print(f"attnscope {method}: {ours(args.model, method, args.threads, args.reps)['ms']:.1f} ms")
    for r in range(args.rounds):
        a = ours(args.model, "ig", args.threads, args.reps)["ms"]
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            captum()
            times.append((time.perf_counter() - start) * 1e3)
        c = statistics.median(times)
        print(f"round {r + 1}: ig attnscope {a:.1f} ms, Captum {c:.1f} ms: {c / a:.2f}×")


if __name__ == "__main__":
    main()
