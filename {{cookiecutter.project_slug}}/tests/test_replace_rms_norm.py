"""replace_rms_norm on tiny Hugging Face models built from a config (no downloads): the swapped
model computes what the original did, keeps its Parameters, compiles without graph breaks and
trains under FSDP2 (fully_shard)."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

from {{ cookiecutter.package_name }} import RMSNorm, replace_rms_norm

MODELS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def tiny_model(name):
    config, model = MODELS[name]
    torch.manual_seed(0)
    model = model(
        config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=128,
        )
    )
    with torch.no_grad():  # weights other than the initial ones, as a trained model has
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("name", MODELS)
def test_swapped_model_matches_the_original(name):
    model = tiny_model(name)
    original = copy.deepcopy(model)
    norms = {n: m for n, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")}
    assert len(norms) > 2 * 2  # two per layer and the final one (Qwen3 also norms q and k)
    result = replace_rms_norm(model)
    assert sorted(result.replaced) == sorted(norms) and result.skipped == {}
    for n, old in norms.items():
        new = model.get_submodule(n)
        assert type(new) is RMSNorm
        assert new.weight is old.weight  # the same Parameter object: optimizers keep theirs
        assert new.eps == old.variance_epsilon
    assert_trains_like(model, original)


def assert_trains_like(model, original, grad_of=lambda p: p.grad):
    """model's logits are original's, and so are its Parameters' gradients (grad_of reads one)."""
    ids = torch.randint(0, 128, (2, 12))
    logits, expected = model(ids).logits, original(ids).logits
    torch.testing.assert_close(logits, expected)
    grad = torch.randn_like(logits)
    logits.backward(grad)
    expected.backward(grad)
    grads = {n: grad_of(p) for n, p in model.named_parameters()}
    expected_grads = {n: p.grad for n, p in original.named_parameters()}
    # float32 sums in another order, through every layer (the message names the parameter)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-4)


def test_swapped_decoder_layer_compiles_without_graph_breaks():
    model = tiny_model("qwen3")
    replace_rms_norm(model)
    layer = model.model.layers[0]
    x = torch.randn(2, 12, 64)
    position_embeddings = model.model.rotary_emb(x, torch.arange(12).expand(2, 12))
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(
        compiled(x, position_embeddings=position_embeddings),
        layer(x, position_embeddings=position_embeddings),
    )


class EpsOutsideTheRoot(torch.nn.Module):  # x / (rms + eps): not the math RMSNorm computes
    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = 1e-3

    def forward(self, x):
        return self.weight * x / (x.square().mean(-1, keepdim=True).sqrt() + self.eps)


EpsOutsideTheRoot.__name__ = "EpsOutsideRMSNorm"  # a name that makes it a candidate


def test_leaves_other_math_alone_and_says_why():
    model = torch.nn.Sequential(
        GemmaRMSNorm(64),  # scales by 1 + weight
        EpsOutsideTheRoot(64),
        torch.nn.RMSNorm(64),  # eps=None: the machine epsilon, kept as None
        torch.nn.RMSNorm(64, eps=1e-5, elementwise_affine=False),
    )
    gemma_weight = model[0].weight.detach().clone()
    rng = torch.random.get_rng_state()
    result = replace_rms_norm(model)
    assert result.replaced == ["2", "3"]
    assert result.skipped.keys() == {"0", "1"}
    assert all("differs from RMSNorm's" in reason for reason in result.skipped.values())
    assert type(model[0]) is GemmaRMSNorm and type(model[1]) is EpsOutsideTheRoot
    torch.testing.assert_close(model[0].weight, gemma_weight, rtol=0, atol=0)  # probe left it
    assert torch.equal(torch.random.get_rng_state(), rng)  # and the random stream
    assert model[2].eps is None and model[3].eps == 1e-5 and model[3].weight is None
    x = torch.randn(3, 64)
    torch.testing.assert_close(model[2](x), torch.nn.functional.rms_norm(x, (64,), model[2].weight))


@pytest.fixture
def one_process_group():
    """A gloo process group of this process alone (its store in memory: no port, no peer)."""
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_swapped_model_trains_under_fully_shard(one_process_group):
    # FSDP2 replaces each Parameter with a sharded DTensor and gathers it for the forward: the
    # swapped norms must compute with the gathered weight and send their gradient to the shard.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = tiny_model("llama")
    replace_rms_norm(model)
    expected_model = copy.deepcopy(model)
    # On the CPU, where the model is: without a mesh, fully_shard takes a GPU where there is one.
    mesh = init_device_mesh("cpu", (1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert_trains_like(model, expected_model, grad_of=lambda p: p.grad.full_tensor())
