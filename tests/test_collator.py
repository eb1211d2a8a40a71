"""Masking is a pure function of (seed, epoch, sample index); padding rounds up; special tokens stay."""

from __future__ import annotations

import functools

import torch

from train.model.collator import IGNORE_INDEX, MaskingCollator

PAD, CLS, SEP, MASK, VOCAB = 0, 2, 3, 4, 1000


def sample(index: int, length: int) -> dict:
    ids = [CLS] + [10 + (index * 7 + i) % 900 for i in range(length - 2)] + [SEP]
    return {"input_ids": ids, "special_tokens_mask": [1] + [0] * (length - 2) + [1], "sample_index": index}


def collator(**kw) -> MaskingCollator:
    return MaskingCollator(pad_token_id=PAD, mask_token_id=MASK, vocab_size=VOCAB, **kw)


def test_masks_do_not_depend_on_batch_composition() -> None:
    c = collator()
    alone = c([sample(5, 40)])
    together = c([sample(1, 20), sample(5, 40), sample(9, 60)])
    assert torch.equal(alone["labels"][0], together["labels"][1][:40])
    assert torch.equal(alone["input_ids"][0], together["input_ids"][1][:40])


def test_same_seed_same_masks_other_epoch_other_masks() -> None:
    batch = [sample(i, 100) for i in range(8)]
    first = collator(seed=1)(batch)
    assert torch.equal(first["labels"], collator(seed=1)(batch)["labels"])
    assert not torch.equal(first["labels"], collator(seed=2)(batch)["labels"])
    assert not torch.equal(first["labels"], collator(seed=1, epoch=1)(batch)["labels"])


def test_masking_rate_and_replacement_mix() -> None:
    batch = collator(mlm_probability=0.15)([sample(i, 128) for i in range(200)])
    chosen = batch["labels"] != IGNORE_INDEX
    rate = chosen.float().sum() / (200 * 126)
    assert 0.13 < rate < 0.17
    masked = (batch["input_ids"] == MASK) & chosen
    assert 0.75 < masked.sum() / chosen.sum() < 0.85


def test_special_and_padding_positions_are_never_masked() -> None:
    batch = collator()([sample(i, 10 + i) for i in range(30)])
    assert (batch["labels"][:, 0] == IGNORE_INDEX).all()  # [CLS]
    for row in range(30):
        length = 10 + row
        assert batch["labels"][row, length - 1] == IGNORE_INDEX  # [SEP]
        assert (batch["labels"][row, length:] == IGNORE_INDEX).all()
        assert (batch["input_ids"][row, length:] == PAD).all()
        assert batch["attention_mask"][row].sum() == length


def test_dynamic_padding_rounds_to_multiple_of_8() -> None:
    assert collator()([sample(0, 13), sample(1, 9)])["input_ids"].shape == (2, 16)
    assert collator(pad_to_multiple_of=None)([sample(0, 13)])["input_ids"].shape == (1, 13)


def test_padded_inputs_keep_their_attention_mask() -> None:
    feature = sample(3, 6)
    feature["input_ids"] += [PAD, PAD]
    feature["special_tokens_mask"] += [1, 1]
    feature["attention_mask"] = [1] * 6 + [0, 0]
    batch = collator()([feature])
    assert batch["attention_mask"].tolist() == [[1] * 6 + [0, 0]]
    assert (batch["labels"][0, 6:] == IGNORE_INDEX).all()


def test_the_replacement_mix_is_the_options() -> None:
    originals = torch.tensor([sample(i, 128)["input_ids"] for i in range(200)])
    for to_mask, to_random in ((1.0, 0.0), (0.5, 0.3), (0.0, 0.0)):
        batch = collator(mlm_probability=0.3, mask_replace_prob=to_mask, random_replace_prob=to_random)(
            [sample(i, 128) for i in range(200)]
        )
        chosen = batch["labels"] != IGNORE_INDEX
        masked = ((batch["input_ids"] == MASK) & chosen).sum() / chosen.sum()
        kept = ((batch["input_ids"] == originals) & chosen).sum() / chosen.sum()
        assert abs(masked - to_mask) < 0.03 and abs(kept - (1 - to_mask - to_random)) < 0.03, (to_mask, to_random)


def test_evaluation_masks_at_its_own_rate_the_same_way_every_time() -> None:
    training = collator(mlm_probability=0.3, epoch=3)
    assert training.for_evaluation(None) is training
    evaluation = training.for_evaluation(0.15)
    batch = [sample(i, 128) for i in range(200)]
    rate = (evaluation(batch)["labels"] != IGNORE_INDEX).float().sum() / (200 * 126)
    assert 0.13 < rate < 0.17 and evaluation.epoch == 0 and training.mlm_probability == 0.3
    assert torch.equal(evaluation(batch)["labels"], training.for_evaluation(0.15)(batch)["labels"])


def test_whole_words_are_masked_together_and_stay_index_seeded() -> None:
    import numpy as np

    # Every third token id starts a word: the samples' consecutive ids make words of up to 3 pieces.
    starts = np.arange(VOCAB) % 3 == 0
    words = collator(word_start=starts, mlm_probability=0.3)
    batch = [sample(i, 120) for i in range(50)]
    masked = words(batch)
    assert torch.equal(masked["labels"], words(batch)["labels"])  # same seed, same masks
    for row, feature in enumerate(batch):
        ids = np.asarray(feature["input_ids"])
        chosen = (masked["labels"][row, : len(ids)] != IGNORE_INDEX).numpy()
        word = np.cumsum(starts[ids] | (np.arange(len(ids)) <= 1))  # [CLS], then the first piece starts a word
        for number in np.unique(word[1:-1]):  # every word is all masked or all not ([CLS], [SEP] never)
            assert len(set(chosen[word == number])) == 1
        assert not chosen[0] and not chosen[-1]
    rate = words.measure([batch])["realised"]
    assert rate is not None and 0.2 < rate < 0.4  # words chosen at 0.3: as many tokens on average
    # Without the vocabulary's word starts the masks are today's, token by token.
    assert torch.equal(collator(mlm_probability=0.3)(batch)["labels"], collator(mlm_probability=0.3)(batch)["labels"])
    assert not torch.equal(collator(mlm_probability=0.3)(batch)["labels"], masked["labels"])


def test_documents_apart_packed_rows_and_flattened_batches() -> None:
    from transformers import BertConfig

    from train.model.packing import isolated_inputs

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    isolate = functools.partial(isolated_inputs, config=config, attn_implementation="sdpa")
    blocks = [{**sample(i, 12), "document_lengths": [5, 7]} for i in range(2)]
    packed = collator(isolate=isolate, pad_to_multiple_of=None)(blocks)  # as the job builds it for packed blocks
    assert packed["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]
    mask = packed["attention_mask"][0, 0]
    assert mask[4, :5].all() and not mask[4, 5:].any() and not mask[5, :5].any()
    assert torch.equal(
        packed["labels"], collator(pad_to_multiple_of=None)(blocks)["labels"]
    )  # the same masks as without isolation

    examples = [sample(1, 6), sample(2, 9), sample(3, 4)]
    flat = collator(isolate=isolate, flatten=True)(examples)
    assert flat["input_ids"].shape == (1, 19)  # no padding at all
    assert flat["position_ids"][0].tolist() == [*range(6), *range(9), *range(4)]
    assert torch.equal(
        flat["labels"][0], torch.cat([collator()([e])["labels"][0, : len(e["input_ids"])] for e in examples])
    )
    facts = collator(isolate=isolate, flatten=True).measure([examples])
    assert (
        facts["efficiency"] == 1.0 and collator(pad_to_multiple_of=None).measure([examples])["efficiency"] == 19 / 27
    )  # 3 rows of 9


def test_a_rate_schedule_thins_masks_drawn_at_its_highest_rate_to_the_steps_rate() -> None:
    """A schedule's collator masks as a plain one at its highest rate and hands the draws; thinned to a lower rate,
    the kept masks are a subset masked at that rate, and every dropped position has its token back."""
    from train.model.collator import MASK_DRAW, thin_masks

    batch = [sample(i, 128) for i in range(200)]
    plain = collator(mlm_probability=0.3)(batch)
    drawn = collator(mlm_probability=0.3, mask_draws=True)(batch)
    assert torch.equal(drawn["labels"], plain["labels"]) and torch.equal(drawn["input_ids"], plain["input_ids"])
    assert MASK_DRAW not in plain and (drawn[MASK_DRAW][drawn["labels"] == IGNORE_INDEX] == 1.0).all()

    same = thin_masks(drawn, 0.3)
    assert MASK_DRAW not in same and torch.equal(same["labels"], plain["labels"])
    thinned = thin_masks(drawn, 0.15)
    kept = thinned["labels"] != IGNORE_INDEX
    assert 0.13 < kept.float().sum() / (200 * 126) < 0.17
    assert not (kept & (plain["labels"] == IGNORE_INDEX)).any()  # a subset of the masks drawn
    dropped = (plain["labels"] != IGNORE_INDEX) & ~kept
    assert torch.equal(thinned["input_ids"][dropped], plain["labels"][dropped])  # the original tokens
    assert torch.equal(thinned["input_ids"][kept], plain["input_ids"][kept])  # kept masks as drawn (80/10/10)
    assert 0.75 < ((thinned["input_ids"] == MASK) & kept).sum() / kept.sum() < 0.85


def test_a_schedules_evaluation_masks_at_a_fixed_rate_without_draws() -> None:
    from train.model.collator import MASK_DRAW, evaluation_rate

    training = collator(mlm_probability=0.3, mask_draws=True, epoch=2)
    assert evaluation_rate(0.3, 0.15, None) == 0.3 and evaluation_rate(0.3, 0.15, 0.2) == 0.2
    assert evaluation_rate(0.3, None, None) is None
    evaluation = training.for_evaluation(evaluation_rate(0.15, 0.3, None))  # a rising schedule: masks at 0.3
    batch = [sample(i, 128) for i in range(200)]
    out = evaluation(batch)
    assert MASK_DRAW not in out and evaluation.epoch == 0
    assert 0.13 < (out["labels"] != IGNORE_INDEX).float().sum() / (200 * 126) < 0.17


def test_whole_words_and_flattened_batches_carry_their_draws() -> None:
    import numpy as np
    from transformers import BertConfig

    from train.model.collator import MASK_DRAW, thin_masks
    from train.model.packing import isolated_inputs

    starts = np.arange(VOCAB) % 3 == 0
    batch = [sample(i, 120) for i in range(50)]
    words = collator(word_start=starts, mlm_probability=0.3, mask_draws=True)(batch)
    thinned = thin_masks(words, 0.1)
    for row, feature in enumerate(batch):  # a thinned word is still all masked or all not
        ids = np.asarray(feature["input_ids"])
        chosen = (thinned["labels"][row, : len(ids)] != IGNORE_INDEX).numpy()
        word = np.cumsum(starts[ids] | (np.arange(len(ids)) <= 1))
        for number in np.unique(word[1:-1]):
            assert len(set(chosen[word == number])) == 1

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    isolate = functools.partial(isolated_inputs, config=config, attn_implementation="sdpa")
    examples = [sample(1, 6), sample(2, 9), sample(3, 4)]
    flat = collator(isolate=isolate, flatten=True, mlm_probability=0.5, mask_draws=True)(examples)
    assert flat[MASK_DRAW].shape == flat["labels"].shape == (1, 19) and "position_ids" in flat
    assert torch.equal(thin_masks(flat, 0.5)["labels"], flat["labels"])


def test_a_batch_warm_up_keeps_the_first_rows_of_every_layout() -> None:
    """first_rows cuts every per-row tensor (a 4D mask and ModernBERT's dict of them too) and the flash-attention
    boundaries at the last kept row."""
    from train.model.collator import first_rows
    from train.model.packing import varlen_kwargs

    batch = collator(mask_draws=True)([sample(i, 12) for i in range(6)])
    kept = first_rows(batch, 2)
    assert all(value.shape[0] == 2 for value in kept.values()), {k: v.shape for k, v in kept.items()}
    assert torch.equal(kept["labels"], batch["labels"][:2]) and first_rows(batch, 6) is batch
    masks = {"full_attention": torch.zeros(6, 1, 12, 12), "sliding_attention": torch.zeros(6, 1, 12, 12)}
    assert first_rows({**batch, "attention_mask": masks}, 3)["attention_mask"]["sliding_attention"].shape[0] == 3
    documents = torch.tensor([[0] * 5 + [1] * 7] * 6)
    flat = {"input_ids": torch.zeros(6, 12, dtype=torch.long), **varlen_kwargs(documents)}
    cut = first_rows(flat, 2)
    assert cut["cu_seq_lens_q"].tolist() == varlen_kwargs(documents[:2])["cu_seq_lens_q"].tolist() == [0, 5, 12, 17, 24]
    assert cut["max_length_q"] == cut["max_length_k"] == 7
