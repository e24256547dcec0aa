"""Analysis of learned graphs: comparison with gold syntax."""
from glomo_pyg.analysis.syntax import (Alignment, GraphScores, SyntaxComparison, SyntaxScores,
                                       align, compare_with_syntax, syntax_scores, untrained_copy)
from glomo_pyg.analysis.treebank import GoldTree, TreebankFormatError, read_treebank

__all__ = ["Alignment", "GoldTree", "GraphScores", "SyntaxComparison", "SyntaxScores",
           "TreebankFormatError", "align", "compare_with_syntax", "read_treebank",
           "syntax_scores", "untrained_copy"]
