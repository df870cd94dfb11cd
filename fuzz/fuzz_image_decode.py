"""Images through llmrun's header check and then libmtmd's decoder (stb_image, through
``mtmd_helper_bitmap_init_from_buf``), as `llmrun run --image`, chat, batch and the server reach it
(``llmrun.backends.gguf_vision.decode``). The property, besides returning or refusing with llmrun's own
error: the decoder never makes more pixels than the header llmrun checked declares (else the size and
pixel limits could be passed around), and a crash in the C decoder stops the fuzzer with the input.

No model is loaded: for an image the decoder does not use libmtmd's context (only an audio file would,
and llmrun's check lets only PNG, JPEG, GIF and BMP headers through)."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.backends.gguf_vision import decode
    from llmrun.formats.image import sniff

import llama_cpp.mtmd_cpp as mtmd


def one(data: bytes) -> None:
    declared = sniff(data)
    bitmap = decode(mtmd, None, data)
    try:
        width, height = mtmd.mtmd_bitmap_get_nx(bitmap), mtmd.mtmd_bitmap_get_ny(bitmap)
    finally:
        mtmd.mtmd_bitmap_free(bitmap)
    if width * height > declared.width * declared.height:
        raise AssertionError(
            f"decoded {width} × {height}; the checked header declared {declared.width} × {declared.height}"
        )


if __name__ == "__main__":
    harness.main(one)
