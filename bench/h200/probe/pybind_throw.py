"""What kills a pybind11 function of a torch extension on this machine (sixth session: a
TORCH_CHECK in ternary._C.fused_route segfaulted on the H200 image). The suspects are the
throw itself and the integer streamed into the message through c10::str (csrc/ops.cpp's
to_text comment: std::num_put of two libstdc++ builds). Each case runs in its own process, so
a crash is reported, not fatal:
    python3 bench/h200/probe/pybind_throw.py"""

import subprocess
import sys
import tempfile

SRC = r"""
#include <torch/extension.h>
#include <stdexcept>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("torch_check", [](int64_t a) { TORCH_CHECK(a >= 0, "a=", a); return a; });
  m.def("torch_check_text", [](int64_t a) {
    TORCH_CHECK(a >= 0, std::string("a=") + std::to_string(a));
    return a;
  });
  m.def("stream_int", [](int64_t a) { return c10::str("a=", a); });
  m.def("runtime_error", [](int64_t a) { if (a < 0) throw std::runtime_error("a<0"); return a; });
  m.def("value_error", [](int64_t a) { if (a < 0) throw pybind11::value_error("a<0"); return a; });
}
"""


def main() -> int:
    build = tempfile.mkdtemp()
    from torch.utils.cpp_extension import load_inline

    load_inline("pybind_throw_probe", cpp_sources=[SRC], build_directory=build, verbose=False)
    for case in ("torch_check", "torch_check_text", "stream_int", "runtime_error", "value_error"):
        code = (f"import sys, torch; sys.path.insert(0, {build!r}); import pybind_throw_probe as p\n"
                f"try:\n    print('returned', p.{case}(-1))\nexcept Exception as e:\n"
                f"    print(type(e).__name__, e)\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=False)
        print(f"{case}: rc={r.returncode} {r.stdout.strip()[:100]} {r.stderr.strip()[-200:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
