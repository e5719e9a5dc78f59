"""Translation speed: `attnscope bench translate` against transformers' `generate()` on
Marian-base shapes (6 + 6 layers, d_model 512, 8 heads, FFN 2048, vocabulary 59,514, random
weights), greedy and 4-beam, the same source, threads and new-token limit, in the same run.

usage: python scripts/bench_translate.py DIR [--threads 2] [--reps 5] [--new-tokens 20]
       (after: cargo build --release -p attnscope)

DIR is made on first use (nothing downloaded): MarianMTModel with those shapes, transformers'
random initialisation, with the SentencePiece models and vocab.json of tests/data/s2s/marian.
Prints, per beam count, each side's median ms per translation, the ratio, whether the ids
agree, and what capturing all three attention kinds of the translation adds to attnscope's time.
"""
import argparse, json, os, shutil, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "target", "release", "attnscope")
TESTS = os.path.join(ROOT, "tests", "data", "s2s", "marian")
# 20 pieces and </s> with the test SentencePiece model.
SOURCE = "The mouse lived in the barn"


def make(out_dir):
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel
    os.makedirs(out_dir, exist_ok=True)
    for f in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TESTS, f), out_dir)
    vocab = 59514
    cfg = MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=512, encoder_layers=6,
                       decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
                       encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
                       pad_token_id=vocab - 1, eos_token_id=0, decoder_start_token_id=vocab - 1,
                       forced_eos_token_id=0, scale_embedding=True, activation_function="swish",
                       share_encoder_decoder_embeddings=True, architectures=["MarianMTModel"])
    torch.manual_seed(0)
    model = MarianMTModel(cfg).eval()
    model.generation_config = GenerationConfig(decoder_start_token_id=vocab - 1, eos_token_id=0,
                                               forced_eos_token_id=0, pad_token_id=vocab - 1,
                                               bad_words_ids=[[vocab - 1]], max_length=512)
    model.save_pretrained(out_dir, safe_serialization=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=20)
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.dir, "model.safetensors")):
        make(args.dir)
    import torch
    from transformers import MarianMTModel, MarianTokenizer
    torch.set_num_threads(args.threads)
    tok = MarianTokenizer.from_pretrained(args.dir)
    model = MarianMTModel.from_pretrained(args.dir).eval()
    ids = tok(SOURCE, return_tensors="pt")["input_ids"]
    print(f"load: {os.getloadavg()}; threads {args.threads}; {ids.shape[1]} source tokens")
    for beams in (1, 4):
        kwargs = dict(max_new_tokens=args.new_tokens, num_beams=beams, do_sample=False)
        with torch.no_grad():
            out = model.generate(ids, **kwargs)
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                model.generate(ids, **kwargs)
                times.append((time.perf_counter() - start) * 1e3)
        theirs = sorted(times)[len(times) // 2]
        o = subprocess.run([OURS, "bench", "translate", "--model", args.dir, "--source", SOURCE,
                            "--max-new-tokens", str(args.new_tokens), "--num-beams", str(beams),
                            "--threads", str(args.threads), "--reps", str(args.reps), "--json"],
                           capture_output=True, text=True)
        if o.returncode != 0:
            sys.exit(f"bench translate failed:\n{o.stderr}")
        ours = json.loads(o.stdout)
        same = ours["ids"] == out[0, 1:].tolist()
        print(f"{beams} beam{'s' if beams > 1 else ' '}: attnscope {ours['ms']:.1f} ms, transformers "
              f"{theirs:.1f} ms → {theirs / ours['ms']:.2f}× ({len(ours['ids'])} new tokens, ids "
              f"{'equal' if same else 'DIFFER'}); capturing the attentions +{ours['capture_ms']:.1f} ms "
              f"({ours['capture_ms'] / ours['ms'] * 100:.0f}%)")


if __name__ == "__main__":
    main()
