"""The bit layout of llguidance's masks read right: token t is bit t % 32 of word t // 32."""

import torch

from kvpilot_server.engine.structured.masks import StepMasks, biases


def test_biases_follow_the_bits():
    generator = torch.Generator().manual_seed(0)
    vocab = 100  # not a multiple of 32: the last word's high bits are padding
    words = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=generator)
    expected = torch.tensor(
        [
            [0.0 if (int(row[t // 32]) >> (t % 32)) & 1 else float("-inf") for t in range(vocab)]
            for row in words
        ]
    )
    assert torch.equal(biases(words, vocab), expected)


def test_apply_masks_only_the_constrained_rows_and_reports_failures():
    logits = torch.zeros(3, 40)
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 0] = 0b101  # tokens 0 and 2
    masks = StepMasks(bitmask, rows={7: 0}, errors={9: "no token fits"})
    failed = masks.apply(logits, [5, 7, 9])
    assert torch.equal(logits[0], torch.zeros(40))
    assert logits[1].isfinite().nonzero().flatten().tolist() == [0, 2]
    assert list(failed) == [2] and "no token fits" in str(failed[2])
