"""Where the real rewards' weights come from: the Hugging Face repositories, the files each needs,
and the narrowed download commands (solbench.doctor lists them; the rewards resolve them)."""

from __future__ import annotations

from dataclasses import dataclass

from solbench.models.hub import download_command

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
LAION_H14 = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
CLIP_L14 = "openai/clip-vit-large-patch14"
HPS_REPO = "xswu/HPSv2"
HPS_FILE = "HPS_v2.1_compressed.pt"
IMAGEREWARD_REPO = "THUDM/ImageReward"
IMAGEREWARD_FILE = "ImageReward.pt"
IMAGEREWARD_MED_CONFIG = "med_config.json"
BERT_BASE = "google-bert/bert-base-uncased"


@dataclass(frozen=True)
class WeightSource:
    """One Hugging Face repository a reward needs, and the files in it that must be present.

    ``files`` lists requirements; an entry with ``|`` is satisfied by any one of its alternatives
    (``"model.safetensors|pytorch_model.bin"``). ``include`` narrows the download command to the
    files actually used (the laion ViT-H-14 repository is only needed for its tokenizer, not its
    3.9 GB of weights).
    """

    repo_id: str
    files: tuple[str, ...]
    purpose: str
    include: tuple[str, ...] = ()
    gated: bool = False

    def command(self) -> str:
        return download_command(self.repo_id, self.include)



# reads the repository's config.json when loading by repo id from the cache (transformers 5), so it
# is required here too (`--include '*.json'` fetches it).
WEIGHTS: dict[str, tuple[WeightSource, ...]] = {
    "pickscore": (
        WeightSource(PICKSCORE_MODEL, ("config.json", "model.safetensors|pytorch_model.bin"),
                     "PickScore_v1 CLIP ViT-H/14 weights"),
        WeightSource(LAION_H14, ("preprocessor_config.json", "tokenizer.json|vocab.json", "config.json"),
                     "CLIP ViT-H/14 tokenizer and processor", include=("*.json", "*.txt")),
    ),
    "clipscore": (
        WeightSource(CLIP_L14, ("config.json", "model.safetensors|pytorch_model.bin", "tokenizer.json|vocab.json"),
                     "CLIP ViT-L/14 weights and tokenizer",
                     include=("*.json", "*.txt", "model.safetensors")),
    ),
    "hpsv2": (
        WeightSource(HPS_REPO, (HPS_FILE,), "HPSv2.1 open_clip ViT-H/14 checkpoint", include=(HPS_FILE,)),
        WeightSource(LAION_H14, ("tokenizer.json|vocab.json", "config.json"), "CLIP ViT-H/14 tokenizer",
                     include=("*.json", "*.txt")),
    ),
    "imagereward": (
        WeightSource(IMAGEREWARD_REPO, (IMAGEREWARD_FILE, IMAGEREWARD_MED_CONFIG), "ImageReward v1.0 checkpoint"),
        WeightSource(BERT_BASE, ("vocab.txt",), "BERT tokenizer used by ImageReward's BLIP",
                     include=("vocab.txt", "tokenizer_config.json", "tokenizer.json", "config.json")),
    ),
}

