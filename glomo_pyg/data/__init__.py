"""Data sets, corpora and readers."""
from glomo_pyg.data.aclimdb import Review, read_aclimdb
from glomo_pyg.data.synthetic import PlantedDependencyCorpus, Vocabulary
from glomo_pyg.data.text import TextDataError, WordVocabulary, read_text_documents, tokenize
from glomo_pyg.data.tokens import (
                                   ResumableLoader,
                                   ResumableSampler,
                                   TokenWindows,
                                   read_shard_index,
                                   write_token_shards,
)
from glomo_pyg.data.word_vectors import (
                                   embedding_matrix,
                                   read_word_vectors,
                                   train_word_vectors,
                                   write_word_vectors,
)

__all__ = ["PlantedDependencyCorpus", "ResumableLoader", "ResumableSampler", "Review",
           "TextDataError", "TokenWindows", "Vocabulary", "WordVocabulary", "embedding_matrix",
           "read_aclimdb", "read_shard_index", "read_text_documents", "read_word_vectors",
           "tokenize", "train_word_vectors", "write_token_shards", "write_word_vectors"]
