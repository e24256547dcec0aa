"""Lightning pretraining, the quickstart job and the command line."""
import json

import pytest
import torch
from torch_geometric.loader import DataLoader

from glomo_pyg import PretrainedGraphPredictor
from glomo_pyg.cli import main
from glomo_pyg.data import PlantedDependencyCorpus
from glomo_pyg.training import GlomoPretraining
from glomo_pyg.training.quickstart import QuickstartConfig, run_quickstart

TINY_MODEL = dict(hidden_channels=16, num_layers=1, heads=2, cnn_layers=1, num_positions=8)


def test_graph_predictor_is_frozen_during_warmup_then_scaled():
    module = GlomoPretraining(num_tokens=20, **TINY_MODEL, lr=1e-2, graph_lr_scale=0.5,
                              graph_warmup_steps=3)
    config = module.configure_optimizers()
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]["scheduler"]
    graph_ids = {id(p) for p in module.model.graph_parameters()}
    assert {id(p) for p in optimizer.param_groups[1]["params"]} == graph_ids
    assert graph_ids and not graph_ids & {id(p) for p in optimizer.param_groups[0]["params"]}
    rates = []
    for _ in range(5):
        rates.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        schedule.step()
    assert rates[0] == [1e-2, 0.0] and rates[2] == [1e-2, 0.0]
    assert rates[3] == pytest.approx([1e-2, 5e-3])


def test_decoupled_ablation_exposes_its_scorer_as_graph_parameters():
    module = GlomoPretraining(num_tokens=20, decouple=False, **TINY_MODEL)
    scorer_params = {id(p) for fp in module.model.feature_predictors.values()
                     for p in fp.scorer.parameters()}
    assert {id(p) for p in module.model.graph_parameters()} == scorer_params


def test_typed_arguments_take_each_modality_s_declared_defaults():
    from glomo_pyg.nn.settings import IMAGE_DEFAULTS, TEXT_DEFAULTS

    text = GlomoPretraining(num_tokens=20, num_layers=1, heads=2)
    image = GlomoPretraining(modality="image", num_layers=1, heads=2, height=8, width=8)
    for module, defaults in ((text, TEXT_DEFAULTS), (image, IMAGE_DEFAULTS)):
        settings = module.model_settings  # (None in the signature: the modality's default)
        assert settings["hidden_channels"] == defaults.hidden_channels
        assert settings["num_positions"] == defaults.num_positions
        assert module.hparams["hidden_channels"] is None  # (as given: what a CLI records)
    assert image.modality == "image" and image.crop_size == (8, 8)
    assert GlomoPretraining(num_tokens=20, norm=None, **TINY_MODEL).model_settings["norm"] is None
    with pytest.raises(TypeError, match="decouple: not a setting of the image model"):
        GlomoPretraining(modality="image", decouple=False)
    with pytest.raises(TypeError, match="num_tokens .* is required"):
        GlomoPretraining(**TINY_MODEL)


def test_the_deprecated_model_kwargs_mapping_builds_the_same_module():
    with pytest.warns(DeprecationWarning, match="model_kwargs. is deprecated"):
        old = GlomoPretraining(dict(num_tokens=20, **TINY_MODEL), lr=1e-2)
    new = GlomoPretraining(num_tokens=20, **TINY_MODEL, lr=1e-2)
    assert dict(old.hparams) == dict(new.hparams) and "model_kwargs" not in old.hparams
    assert old.model_settings == new.model_settings
    with pytest.raises(TypeError, match="unknown model settings .'channels'."):
        with pytest.warns(DeprecationWarning):
            GlomoPretraining(dict(num_tokens=20, channels=3))


def test_quickstart_runs_lowers_the_loss_and_writes_its_results(tmp_path):
    config = QuickstartConfig(steps=40, batch_size=16, test_sequences=64, graph_warmup_steps=10,
                              model=dict(TINY_MODEL, hidden_channels=32), progress_bar=False,
                              output_dir=str(tmp_path))
    result = run_quickstart(config)
    assert result.final_test_loss < result.initial_test_loss - 0.3
    saved = json.loads((tmp_path / "quickstart.json").read_text())
    assert saved["result"]["final_test_loss"] == pytest.approx(result.final_test_loss)
    assert saved["config"]["steps"] == 40
    loaded = PretrainedGraphPredictor.from_pretrained(tmp_path / "predictor")
    batch = next(iter(DataLoader(PlantedDependencyCorpus(8, seed=0, **config.corpus),
                                 batch_size=8)))
    for got, want in zip(loaded(batch.x, batch.batch), result.model.graphs(batch.x, batch.batch)):
        for l in range(got.num_layers):
            assert torch.equal(got.edge_weight[l], want.edge_weight[l])
    text = result.format()
    assert "graph chosen on validation" in text and "baseline, uniform" in text
    assert 0.0 < result.recovery.uniform < 1.0


@pytest.mark.slow
def test_cli_quickstart_saves_a_loadable_predictor(capsys, tmp_path):
    assert main(["quickstart", "--steps", "3", "--batch-size", "4", "--no-progress",
                 "--graph-warmup-steps", "1", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "precision@1" in out and "chosen graph vs best baseline" in out
    assert f"saved to {tmp_path / 'predictor'}" in out
    predictor = PretrainedGraphPredictor.from_pretrained(tmp_path / "predictor")
    assert predictor.directions == ("forward", "backward")
    assert predictor.vocabulary[:2] == ["filler0", "filler1"] and "cue0" in predictor.vocabulary
    graphs = predictor(predictor.encode(["filler0", "trigger0=1", "filler2", "cue0", "dep1"]))
    assert graphs.forward.num_layers == 2


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="lr"):
        GlomoPretraining(num_tokens=20, **TINY_MODEL, lr=0.0)
    with pytest.raises(ValueError, match="steps"):
        run_quickstart(QuickstartConfig(steps=0))
    with pytest.raises(SystemExit):
        main(["quickstart", "--steps", "many"])
    for kwargs in (dict(lr=float("nan")), dict(lr=float("inf")),
                   dict(graph_lr_scale=float("inf")), dict(weight_decay=float("nan"))):
        with pytest.raises(ValueError, match=f"{next(iter(kwargs))} must be"):
            GlomoPretraining(num_tokens=20, **TINY_MODEL, **kwargs)
    for argv, message in [(["--lr", "nan"], "lr must be a positive number, got nan"),
                          (["--steps", str(10 ** 9)], "at most"),
                          (["--accelerator", "gpu"] if not torch.cuda.is_available() else
                           ["--accelerator", "banana"], "accelerator")]:
        with pytest.raises(SystemExit, match=message):
            main(["quickstart", "--output-dir", "", "--no-progress", *argv])
    with pytest.warns(RuntimeWarning, match="graph predictor stays frozen"):
        run_quickstart(QuickstartConfig(steps=2, batch_size=2, test_sequences=4,
                                        graph_warmup_steps=5, progress_bar=False,
                                        output_dir=None, model=dict(TINY_MODEL)))


@pytest.mark.slow
def test_pretraining_recovers_planted_sources_above_baselines():
    """A short seeded run learns the planted trigger -> cue links (about a minute on 2 cores)."""
    torch.set_num_threads(2)
    config = QuickstartConfig(
        steps=700, batch_size=32, test_sequences=256, seed=0, graph_warmup_steps=100,
        progress_bar=False,
        corpus=dict(min_length=16, max_length=24, num_filler=16, num_slots=2, num_values=4,
                    topic_size=5, min_distance=3, max_distance=10, dependencies=2),
        model=dict(hidden_channels=32, num_layers=1, heads=2, cnn_layers=1, num_positions=32,
                   context_length=2))
    result = run_quickstart(config)
    baseline = max(result.recovery.uniform, result.recovery.previous_token)
    assert result.final_test_loss < result.initial_test_loss - 0.8
    assert result.chosen_precision > max(0.3, 3 * baseline), result.format()
    assert float(result.recovery.per_layer.max()) > 2 * baseline, result.format()
    layer, head = result.chosen  # learned, not there by chance at initialisation
    assert result.chosen_precision > float(result.recovery_untrained.per_graph[layer, head]) + 0.2
