#!/usr/bin/python3
"""Turns a text (the KJV: data/kjv.txt, `make data`) into an llm.c token
file with a byte-level BPE tokenizer trained on it (the `tokenizers`
package from PyPI: `python3 -m pip install tokenizers`).

usage: kjv_bpe_tokens.py TEXT OUT.bin [VOCAB]

VOCAB (default 1024) is the tokenizer's vocabulary, which the model's
embedding and head must cover. Writes OUT.bin in llm.c's format (its
dev/data/data_common.py, write_datafile): 256 little-endian int32 of header
([0] magic 20240520, [1] version 1, [2] the token count, the rest 0), then
the token ids as little-endian uint16; and OUT.bin.json, the tokenizer (to
decode ids back to text). Prints the number of tokens and the bytes per
token. duet's tokens("OUT.bin", block = T) trains on the first 90% of the
tokens and validates on the last 10%.
"""
import struct
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    text_path, out = sys.argv[1], sys.argv[2]
    vocab = int(sys.argv[3]) if len(sys.argv) == 4 else 1024
    if not 256 < vocab <= 65536:
        sys.exit("VOCAB must be in 257..65536 (ids are uint16; the byte alphabet takes 256)")
    text = open(text_path, encoding="utf-8").read()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    lines = text.splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer)
    ids = []
    for enc in tok.encode_batch(lines):
        ids.extend(enc.ids)
    assert max(ids) < vocab and len(ids) < 2**31
    assert tok.decode(ids[:200]) == "".join(lines)[:len(tok.decode(ids[:200]))]
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(out, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(ids), *ids))
    tok.save(out + ".json")
    print("%s: %d tokens (vocabulary %d), %.2f bytes per token" %
          (out, len(ids), tok.get_vocab_size(), len(text.encode()) / len(ids)))


if __name__ == "__main__":
    main()
