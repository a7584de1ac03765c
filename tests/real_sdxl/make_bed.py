#!/usr/bin/env python3
"""Build the offline parts of the sd-scripts SDXL CPU test bed (run with the sd-scripts venv's python).

Makes, under BED:
  model/                     a diffusers SDXL pipeline with RANDOM weights (seed 0, the same on rebuild):
                               the full-size SDXL U-Net (2.57B parameters, saved in bf16: sd-scripts rebuilds it
                               as library/sdxl_original_unet.SdxlUNet2DConditionModel, whose shape is fixed),
                               two narrow CLIP text encoders of the widths the U-Net's cross-attention needs
                               (768 + 1280 = 2048; 11 layers for the first, since sd-scripts reads its
                               hidden_states[11], 2 for the second; 1280-wide projection for the pooled vector),
                               a tiny VAE (factor 8, 4 latent channels)
  model/tokenizer_cache/     the two CLIP tokenizers sd-scripts asks for, built offline from open_clip's BPE
                             table, where --tokenizer_cache_dir looks (join(cache_dir, id.replace("/", "_")))
  data/images/*.png + *.txt  captioned synthetic images
  data/dataset.toml          kohya dataset config for them
  data/prompts.txt           one sample prompt for --sample_prompts

Each part is skipped when its output is complete. usage: make_bed.py --bed DIR --bpe bpe_simple_vocab_16e6.txt.gz
"""
import argparse
import gzip
import json
import os
import random
import shutil
import sys

BED_VERSION = 1  # setup rebuilds model/ and data/ when this changes: raise it with what they hold
TOKENIZER_IDS = ("openai/clip-vit-large-patch14", "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k")
RES = 64  # the smallest multiple of 32 worth using; latents 8x8
CAPTIONS = [
    ("a red cube", (220, 30, 30), "rect"),
    ("a blue ball", (30, 60, 220), "ellipse"),
    ("a green triangle", (30, 180, 60), "tri"),
    ("a yellow square", (230, 210, 40), "rect"),
]


def byte_table():
    """CLIP's printable stand-in for each byte (the same table open_clip and transformers use)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return [chr(c) for c in cs]


def build_tokenizers(bpe_gz, cache_dir):
    from transformers import CLIPTokenizer

    with gzip.open(bpe_gz) as fh:
        lines = fh.read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1 : 49152 - 256 - 2 + 1]]
    units = byte_table()
    vocab = units + [u + "</w>" for u in units] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408, len(vocab)
    raw = os.path.join(cache_dir, ".raw")
    os.makedirs(raw, exist_ok=True)
    with open(os.path.join(raw, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(raw, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(" ".join(m) + "\n" for m in merges))
    for tid in TOKENIZER_IDS:
        tok = CLIPTokenizer(os.path.join(raw, "vocab.json"), os.path.join(raw, "merges.txt"), errors="replace",
                            unk_token="<|endoftext|>", bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>", model_max_length=77)
        ids = tok("a photo of a cat")["input_ids"]
        assert ids == [49406, 320, 1125, 539, 320, 2368, 49407], ids  # CLIP's well-known ids
        out = os.path.join(cache_dir, tid.replace("/", "_"))
        shutil.rmtree(out + ".tmp", ignore_errors=True)
        tok.save_pretrained(out + ".tmp")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(out + ".tmp", out)
    shutil.rmtree(raw, ignore_errors=True)
    return tok


def build_model(model_dir, tok, seed):
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    common = {"vocab_size": 49408, "max_position_embeddings": 77, "intermediate_size": 256,
              "hidden_act": "quick_gelu", "bos_token_id": 49406, "eos_token_id": 49407, "pad_token_id": 49407}
    te1 = CLIPTextModel(CLIPTextConfig(hidden_size=768, num_hidden_layers=11, num_attention_heads=4, **common))
    te2 = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=1280, num_hidden_layers=2, num_attention_heads=4,
                                                     projection_dim=1280, **common))
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                        up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=(32, 32, 32, 32),
                        layers_per_block=1, latent_channels=4, norm_num_groups=32, sample_size=RES,
                        scaling_factor=0.13025)
    # SDXL base 1.0's U-Net config: the only shape sd-scripts' loader accepts. Made in bf16 directly (half the
    # memory and time of an fp32 init of 2.6B parameters).
    torch.set_default_dtype(torch.bfloat16)
    unet = UNet2DConditionModel(
        sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816, norm_num_groups=32,
    )
    torch.set_default_dtype(torch.float32)
    sched = EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                   beta_schedule="scaled_linear", steps_offset=1)
    pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=te1, text_encoder_2=te2, tokenizer=tok, tokenizer_2=tok,
                                     unet=unet, scheduler=sched)
    n = lambda m: sum(p.numel() for p in m.parameters())
    print(f"params: unet={n(unet) / 1e6:.0f}M te1={n(te1) / 1e6:.0f}M te2={n(te2) / 1e6:.0f}M "
          f"vae={n(vae) / 1e6:.2f}M", flush=True)
    tmp = model_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp, safe_serialization=True)
    cache = os.path.join(model_dir, "tokenizer_cache")
    if os.path.isdir(cache):  # built before the model: keep it
        os.replace(cache, os.path.join(tmp, "tokenizer_cache"))
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp, model_dir)


def build_data(data_dir, seed):
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    img_dir = os.path.join(data_dir, "images")
    os.makedirs(img_dir, exist_ok=True)
    for i, (cap, color, shape) in enumerate(CAPTIONS):
        im = Image.new("RGB", (RES, RES), tuple(rng.randrange(0, 90) for _ in range(3)))
        d = ImageDraw.Draw(im)
        a, b = RES // 5 + rng.randrange(RES // 10), RES - RES // 5 - rng.randrange(RES // 10)
        if shape == "rect":
            d.rectangle([a, a, b, b], fill=color)
        elif shape == "ellipse":
            d.ellipse([a, a, b, b], fill=color)
        else:
            d.polygon([(RES // 2, a), (a, b), (b, b)], fill=color)
        im.save(os.path.join(img_dir, f"img{i:02d}.png"))
        with open(os.path.join(img_dir, f"img{i:02d}.txt"), "w", encoding="utf-8") as f:
            f.write(cap + "\n")
    with open(os.path.join(data_dir, "dataset.toml"), "w", encoding="utf-8") as f:
        f.write('[general]\ncaption_extension = ".txt"\nshuffle_caption = false\nenable_bucket = false\n\n'
                f"[[datasets]]\nresolution = {RES}\nbatch_size = 1\n\n"
                f'  [[datasets.subsets]]\n  image_dir = "{img_dir}"\n  num_repeats = 1\n')
    with open(os.path.join(data_dir, "prompts.txt"), "w", encoding="utf-8") as f:
        f.write(f"a red cube --w {RES} --h {RES} --s 2 --d 1\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bed", required=True)
    ap.add_argument("--bpe", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    bed = os.path.abspath(a.bed)
    model_dir = os.path.join(bed, "model")
    cache_dir = os.path.join(model_dir, "tokenizer_cache")
    data_dir = os.path.join(bed, "data")
    from transformers import CLIPTokenizer

    last = os.path.join(cache_dir, TOKENIZER_IDS[-1].replace("/", "_"))
    if not os.path.isfile(os.path.join(last, "vocab.json")):
        print(f"building tokenizers -> {cache_dir}", flush=True)
        tok = build_tokenizers(a.bpe, cache_dir)
    else:
        tok = CLIPTokenizer.from_pretrained(last)
    if not os.path.isfile(os.path.join(model_dir, "unet", "diffusion_pytorch_model.safetensors")):
        print(f"building random SDXL -> {model_dir}", flush=True)
        build_model(model_dir, tok, a.seed)
    if not os.path.isfile(os.path.join(data_dir, "prompts.txt")):
        print(f"building dataset -> {data_dir}", flush=True)
        build_data(data_dir, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
