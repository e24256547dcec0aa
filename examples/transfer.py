"""Add pretrained GLoMo graphs to an existing PyG model.

Run ``glomo quickstart`` first (it saves runs/quickstart/predictor), then
``python examples/transfer.py [predictor directory]``.
"""
import sys

import torch
from torch_geometric.loader import DataLoader
from torch_geometric.nn import global_mean_pool

from glomo_pyg import GlomoTransfer, PretrainedFormatError, PretrainedGraphPredictor
from glomo_pyg.data import PlantedDependencyCorpus
from glomo_pyg.training.quickstart import QuickstartConfig

path = sys.argv[1] if len(sys.argv) > 1 else "runs/quickstart/predictor"
try:
    predictor = PretrainedGraphPredictor.from_pretrained(path)  # frozen g, both directions
except PretrainedFormatError as err:
    sys.exit(f"{err}\n(run `glomo quickstart` first, or pass a predictor directory)")


class Classifier(torch.nn.Module):  # an existing model: embeddings -> pooling -> linear
    def __init__(self, num_tokens: int, dim: int = 64, classes: int = 2):
        super().__init__()
        self.embed = torch.nn.Embedding(num_tokens, dim)            # the model's own features H
        self.glomo = GlomoTransfer(predictor, in_channels=dim)      # + GLoMo: [H ; gate(H, MH)]
        self.out = torch.nn.Linear(self.glomo.out_channels, classes)

    def forward(self, x, batch):
        h = self.glomo(self.embed(x), x, batch)  # graphs from the same units, no gradient to g
        return self.out(global_mean_pool(h, batch))


model = Classifier(predictor.num_tokens)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # g's parameters need no grad
corpus = PlantedDependencyCorpus(256, seed=1, **QuickstartConfig().corpus)
for step, data in enumerate(DataLoader(corpus, batch_size=32, shuffle=True)):
    label = (data.x.view(-1, 1) == torch.tensor(corpus.vocab.dependent(0))).float()
    label = global_mean_pool(label, data.batch).gt(0).long().view(-1)  # "has a dep0 token"
    loss = torch.nn.functional.cross_entropy(model(data.x, data.batch), label)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.3f}")
print(model.glomo)
