"""The data layer: where a corpus is (sources), reading and splitting it (load; its values in raw), tokenizing,
packing and counting (tokenization: not ``tokenize``, which would be shadowed by the function of that name this
package exports), streaming it (stream), the :class:`Corpus` a rank trains on (corpus), and the padding modes with
their rules (padding: :class:`Padding`). A job calls, with its DataArguments ``data`` and its TrainingArguments
``training``::

    raw = load_raw(data, training)                           # either mode: RawData (raw.stream set for a stream)
    corpus = build_corpus(data, raw, tokenizer, rank, world_size, training.seed)
    check_stream_parts(data, corpus)                         # every rank, after main_process_first

and, for ``corpus.streaming``, applies :func:`stream_training_overrides` to its TrainingArguments and adds the
:class:`StreamPosition` callback.
"""

from __future__ import annotations

from train.data.corpus import Corpus, build_corpus, check_stream_parts, no_training_example
from train.data.load import load_raw
from train.data.padding import Padding
from train.data.raw import RawData, TextStream
from train.data.sources import (
    BUILDERS,
    COMPRESSIONS,
    DEMO_SENTENCE,
    Source,
    data_format,
    is_remote,
    resolve,
    shown_url,
    source_files,
)
from train.data.stream import (
    StreamPosition,
    content_index,
    stream_loader,
    stream_training_overrides,
    tokenized_stream,
)
from train.data.stream_resume import ResumedStream, own_loader_state
from train.data.tokenization import (
    DOCUMENT_LENGTHS,
    SAMPLE_INDEX,
    IndexedExamples,
    real_token_count,
    tokenize,
    truncation,
)

__all__ = [
    "BUILDERS",
    "COMPRESSIONS",
    "DEMO_SENTENCE",
    "DOCUMENT_LENGTHS",
    "SAMPLE_INDEX",
    "Corpus",
    "IndexedExamples",
    "Padding",
    "RawData",
    "ResumedStream",
    "Source",
    "StreamPosition",
    "TextStream",
    "build_corpus",
    "check_stream_parts",
    "content_index",
    "data_format",
    "is_remote",
    "load_raw",
    "no_training_example",
    "own_loader_state",
    "real_token_count",
    "resolve",
    "shown_url",
    "source_files",
    "stream_loader",
    "stream_training_overrides",
    "tokenize",
    "tokenized_stream",
    "truncation",
]
