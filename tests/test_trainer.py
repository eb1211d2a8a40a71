"""The Trainer workarounds that can be checked without training: which weights are tied."""

from __future__ import annotations

import torch
from transformers import DistilBertConfig, DistilBertForMaskedLM

from train.run.trainer import tied_parameter_names


def test_tied_weights_are_named_and_nothing_else() -> None:
    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    model = DistilBertForMaskedLM(config)
    assert tied_parameter_names(model) == {"distilbert.embeddings.word_embeddings.weight", "vocab_projector.weight"}
    assert tied_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))) == set()


def test_evaluation_batches_come_from_the_evaluation_collator(tmp_path) -> None:
    from transformers import TrainingArguments

    from train.model.collator import MaskingCollator
    from train.run.trainer import MLMTrainer

    config = DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=50, max_position_embeddings=16)
    training = MaskingCollator(pad_token_id=0, mask_token_id=4, vocab_size=50, mlm_probability=0.3)
    evaluation = training.for_evaluation(0.15)
    rows = [{"input_ids": [2, 7, 8, 3], "special_tokens_mask": [1, 0, 0, 1], "sample_index": i} for i in range(4)]
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], dataloader_num_workers=0)
    trainer = MLMTrainer(
        model=DistilBertForMaskedLM(config), args=args, train_dataset=rows, eval_dataset=rows, data_collator=training
    )
    trainer.eval_collator = evaluation

    def collator_of(loader) -> object:  # the Trainer wraps it to drop the columns the model does not take
        return getattr(loader.collate_fn, "data_collator", loader.collate_fn)

    assert collator_of(trainer.get_eval_dataloader()) is evaluation
    assert trainer.data_collator is training and collator_of(trainer.get_train_dataloader()) is training
