"""The task heads' workloads, and transformers' pipelines on them (for scripts/bench-tasks.sh).

usage: python bench_tasks.py make DIR TOKENIZER_DIR
         DIR/classifier, DIR/qa: MiniLM-sized random checkpoints (6 layers, width 384, 12
         heads, F32, BertForSequenceClassification with 2 labels and BertForQuestionAnswering)
         with TOKENIZER_DIR's tokenizer.json; DIR/sentences.txt (256 lines), DIR/question.txt
         and DIR/context.txt (a context of 384 tokens).
       python bench_tasks.py classify DIR [--threads 2] [--reps 3]
       python bench_tasks.py answer DIR [--threads 2] [--reps 3]
         transformers' warm pipeline on the same workload: one JSON line with the median
         seconds of --reps runs after a warm-up.
"""
import argparse, json, os, shutil, time

import torch
from transformers import (BertConfig, BertForQuestionAnswering, BertForSequenceClassification,
                          PreTrainedTokenizerFast, pipeline)

SENTENCE = ("Review {i}: the movie was good but the ending was terrible, and the music in the "
            "second half was {mood}")
MOODS = ["wonderful", "dull", "far too loud", "just right", "forgettable", "moving"]
QUESTION = "Who invented the transformer?"
FACT = "The transformer architecture was invented by Vaswani et al. in 2017 at Google Brain."
FILLER = ("Attention lets each token look at every other token and weigh what it finds. "
          "Researchers study which words a model attends to while it does a task. ")
CONTEXT_TOKENS = 384


def make(out, tokenizer_dir):
    os.makedirs(out, exist_ok=True)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokenizer_dir, "tokenizer.json"))
    shape = dict(vocab_size=tok.backend_tokenizer.get_vocab_size(), hidden_size=384,
                 num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                 max_position_embeddings=512)
    torch.manual_seed(0)
    heads = {
        "classifier": BertForSequenceClassification(BertConfig(
            **shape, num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"},
            label2id={"NEGATIVE": 0, "POSITIVE": 1})),
        "qa": BertForQuestionAnswering(BertConfig(**shape)),
    }
    for name, model in heads.items():
        d = os.path.join(out, name)
        model.eval().save_pretrained(d, safe_serialization=True)
        shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), d)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 512, "cls_token": "[CLS]", "sep_token": "[SEP]",
                       "pad_token": "[PAD]", "mask_token": "[MASK]", "unk_token": "[UNK]",
                       "do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f, indent=1)
    with open(os.path.join(out, "sentences.txt"), "w") as f:
        for i in range(256):
            f.write(SENTENCE.format(i=i, mood=MOODS[i % len(MOODS)]) + "\n")
    words = (FILLER * 40).split()
    fact = FACT.split()
    context = []
    # The longest context of whole words that stays within CONTEXT_TOKENS, the fact in its middle.
    for n in range(len(words)):
        half = n // 2
        text = " ".join(words[:half] + fact + words[half:n])
        if len(tok(text, add_special_tokens=False)["input_ids"]) > CONTEXT_TOKENS:
            break
        context = text
    with open(os.path.join(out, "question.txt"), "w") as f:
        f.write(QUESTION)
    with open(os.path.join(out, "context.txt"), "w") as f:
        f.write(context)
    print(f"context: {len(tok(context, add_special_tokens=False)['input_ids'])} tokens")


def timed(run, reps):
    run()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["make", "classify", "answer"])
    p.add_argument("dir")
    p.add_argument("tokenizer_dir", nargs="?")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    if a.what == "make":
        return make(a.dir, a.tokenizer_dir)
    torch.set_num_threads(a.threads)
    if a.what == "classify":
        with open(os.path.join(a.dir, "sentences.txt")) as f:
            sentences = f.read().splitlines()
        pipe = pipeline("text-classification", model=os.path.join(a.dir, "classifier"),
                        device=-1, batch_size=32)
        s = timed(lambda: pipe(sentences), a.reps)
        print(json.dumps({"pipeline": "text-classification", "batch_size": 32,
                          "sentences": len(sentences), "seconds": s,
                          "sentences_per_s": len(sentences) / s}))
    else:
        with open(os.path.join(a.dir, "question.txt")) as f:
            question = f.read()
        with open(os.path.join(a.dir, "context.txt")) as f:
            context = f.read()
        pipe = pipeline("question-answering", model=os.path.join(a.dir, "qa"), device=-1)
        s = timed(lambda: pipe(question=question, context=context), a.reps)
        print(json.dumps({"pipeline": "question-answering", "seconds": s}))


if __name__ == "__main__":
    main()
