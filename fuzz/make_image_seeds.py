#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_image_decode (corpus/image_decode/): small JPEG and PNG files
of every kind the decoder handles, by PIL. By hand only:

  python3 fuzz/make_image_seeds.py fuzz/corpus/image_decode
"""
import io
import os
import sys

from PIL import Image


def picture(width, height):
    image = Image.new("RGB", (width, height))
    image.putdata([((x * 37) % 256, (y * 53) % 256, ((x + y) * 11) % 256)
                   for y in range(height) for x in range(width)])
    return image


def main(folder):
    os.makedirs(folder, exist_ok=True)
    rgb = picture(9, 7)
    seeds = {
        "baseline.jpg": (rgb, "JPEG", {"quality": 75}),
        "subsampled_420.jpg": (picture(17, 9), "JPEG", {"quality": 50, "subsampling": 2}),
        "progressive.jpg": (rgb, "JPEG", {"quality": 60, "progressive": True}),
        "gray.jpg": (rgb.convert("L"), "JPEG", {"quality": 60}),
        "cmyk.jpg": (rgb.convert("CMYK"), "JPEG", {"quality": 60}),
        "rgb.png": (rgb, "PNG", {}),
        "rgba.png": (rgb.convert("RGBA"), "PNG", {}),
        "palette.png": (rgb.convert("P", palette=Image.ADAPTIVE, colors=8), "PNG",
                        {"transparency": 0}),
        "gray_alpha.png": (rgb.convert("LA"), "PNG", {}),
        "bilevel.png": (rgb.convert("1"), "PNG", {}),
        "interlaced.png": (rgb, "PNG", {"interlace": 1}),
        "rgb16.png": (Image.new("I;16", (5, 4), 40000), "PNG", {}),
    }
    for name, (image, kind, options) in seeds.items():
        out = io.BytesIO()
        image.save(out, kind, **options)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(out.getvalue())
        print(f"{name}: {len(out.getvalue())} bytes")


if __name__ == "__main__":
    main(sys.argv[1])
