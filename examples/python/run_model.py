"""A torchvision backbone from Python through tvc's C API and ctypes (no torch, no NumPy):
the same steps as examples/c/run_model.c.

    python3 run_model.py LIBTVC_C MODEL NUM_CLASSES WEIGHTS INPUT N H W OUTPUT
    e.g. python3 run_model.py build/libtvc-c-shared.so resnet18 10 resnet18_10.pth images.f32 2 224 224 logits.f32

LIBTVC_C is the shared libtvc-c-shared.so (meson option shared_c_api, the default), which exports only
the tvc_* functions. INPUT holds float32 (N, 3, H, W) values, row-major; OUTPUT receives the
float32 (N, NUM_CLASSES) logits.
"""
import ctypes
import sys
from array import array


class TvcError(RuntimeError):
    pass


def load_library(path):
    lib = ctypes.CDLL(path)
    handle = ctypes.c_void_p
    signatures = {
        "tvc_version": (ctypes.c_char_p, []),
        "tvc_last_error": (ctypes.c_char_p, []),
        "tvc_model_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(handle)]),
        "tvc_model_load_weights": (ctypes.c_int, [handle, ctypes.c_char_p]),
        "tvc_model_forward": (ctypes.c_int, [handle, handle, ctypes.POINTER(handle)]),
        "tvc_model_free": (None, [handle]),
        "tvc_tensor_from_data": (ctypes.c_int, [ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int64),
                                                ctypes.c_int, ctypes.POINTER(handle)]),
        "tvc_tensor_ndim": (ctypes.c_int, [handle]),
        "tvc_tensor_shape": (ctypes.POINTER(ctypes.c_int64), [handle]),
        "tvc_tensor_numel": (ctypes.c_int64, [handle]),
        "tvc_tensor_data": (ctypes.POINTER(ctypes.c_float), [handle]),
        "tvc_tensor_free": (None, [handle]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


def check(lib, status):
    if status != 0:
        raise TvcError(lib.tvc_last_error().decode("utf-8", "replace"))


def main():
    if len(sys.argv) != 10:
        sys.exit(__doc__)
    library, model_name, num_classes, weights, input_path, n, h, w, output_path = sys.argv[1:]
    lib = load_library(library)
    shape = (ctypes.c_int64 * 4)(int(n), 3, int(h), int(w))
    pixels = array("f")
    with open(input_path, "rb") as f:
        pixels.frombytes(f.read())
    if len(pixels) != shape[0] * shape[1] * shape[2] * shape[3]:
        sys.exit(f"{input_path} holds {len(pixels)} float32 values, not {n} x 3 x {h} x {w}")
    data = (ctypes.c_float * len(pixels)).from_buffer(pixels)

    model, image, logits = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    try:
        check(lib, lib.tvc_model_create(model_name.encode(), int(num_classes), ctypes.byref(model)))
        check(lib, lib.tvc_model_load_weights(model, weights.encode()))
        check(lib, lib.tvc_tensor_from_data(data, shape, 4, ctypes.byref(image)))
        check(lib, lib.tvc_model_forward(model, image, ctypes.byref(logits)))
        rows, classes = lib.tvc_tensor_shape(logits)[0], lib.tvc_tensor_shape(logits)[1]
        values = lib.tvc_tensor_data(logits)
        out = array("f", values[: rows * classes])
        for row in range(rows):
            scores = out[row * classes:(row + 1) * classes]
            best = max(range(classes), key=scores.__getitem__)
            print(f"image {row}: class {best} (logit {scores[best]:.4f})")
        with open(output_path, "wb") as f:
            out.tofile(f)
    except TvcError as e:
        sys.exit(f"tvc: {e}")
    finally:
        lib.tvc_tensor_free(logits)
        lib.tvc_tensor_free(image)
        lib.tvc_model_free(model)
    print("tvc", lib.tvc_version().decode())


if __name__ == "__main__":
    main()
