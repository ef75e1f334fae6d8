"""Refuse answers that would render a broken project, before any file is written."""

import keyword
import re
import sys

# Answers arrive as JSON string literals, so quotes or backslashes in them cannot break this file.
PACKAGE_NAME = {{ cookiecutter.package_name | tojson }}
PROJECT_SLUG = {{ cookiecutter.project_slug | tojson }}
VERSION = {{ cookiecutter.version | tojson }}
PYTHON_MIN = {{ cookiecutter.python_min | tojson }}
TORCH_MIN = {{ cookiecutter.torch_min | tojson }}
CUDA_ARCHS = {{ cookiecutter.cuda_archs | tojson }}
EMAIL = {{ cookiecutter.email | tojson }}

# Namespaces that torch itself registers operators in: a package of that name would collide.
TORCH_NAMESPACES = {
    "aten", "prim", "prims", "quantized", "inductor", "higher_order", "c10d", "profiler"
}
# Packages the project imports or its tests and benchmark do; "test" is CPython's own test
# package, which sys.stdlib_module_names leaves out.
SHADOWED = {"torch", "triton", "numpy", "setuptools", "pytest", "matplotlib", "test"}
# The cpp variant also uses the name as a C++ namespace.
CPP_KEYWORDS = set(
    "alignas alignof asm auto bool case catch char char16_t char32_t char8_t concept const "
    "consteval constexpr constinit const_cast decltype default delete do double dynamic_cast enum "
    "explicit export extern float friend goto inline int long mutable namespace new noexcept "
    "nullptr operator private protected public register reinterpret_cast requires short signed "
    "sizeof static static_assert static_cast struct switch template this thread_local throw "
    "typedef typeid typename union unsigned using virtual void volatile wchar_t true false "
    "co_await co_return co_yield and_eq bitand bitor compl not_eq or_eq xor xor_eq".split()
)
# What the project's dependencies support: torch 2.11 and later need Python 3.10 or later. (The
# cpp variant builds for the LibTorch stable ABI of torch_min, which exists from torch 2.10 on.)
OLDEST = {"python_min": (3, 10), "torch_min": (2, 11)}


def package_name_error(name):
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        return "must start with a lowercase letter and hold only lowercase letters, digits and '_'"
    if keyword.iskeyword(name):
        return "is a Python keyword"
    if name in sys.stdlib_module_names:
        return "would shadow the standard-library module of that name"
    if name in SHADOWED:
        return f"would shadow the '{name}' package the project depends on"
    if name in CPP_KEYWORDS:
        return "is a C++ keyword (the name is also the C++ namespace of the kernels)"
    if name in TORCH_NAMESPACES:
        return f"is an operator namespace that torch itself uses (torch.ops.{name})"
    return None


def main():
    errors = []
    why = package_name_error(PACKAGE_NAME)
    if why:
        # package_name defaults to project_slug with '-' as '_': name the answer it came from.
        derived = PACKAGE_NAME == PROJECT_SLUG.replace("-", "_")
        source = f" (derived from project_slug {PROJECT_SLUG!r})" if derived else ""
        errors.append(
            f"package_name {PACKAGE_NAME!r}{source} {why}. It is the import name and the "
            "torch.library namespace: use a lowercase Python identifier such as 'my_ops'."
        )
    if not re.fullmatch(r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?", PROJECT_SLUG):
        errors.append(
            f"project_slug {PROJECT_SLUG!r} must be a lowercase distribution name: "
            "letters, digits, '.', '_' or '-', starting and ending with a letter or digit."
        )
    if not re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", VERSION):
        errors.append(f"version {VERSION!r} must be a PEP 440 version such as '0.1.0'.")
    for key, value in (("python_min", PYTHON_MIN), ("torch_min", TORCH_MIN)):
        major, minor = OLDEST[key]
        if not re.fullmatch(r"\d+\.\d+", value):
            errors.append(f"{key} {value!r} must be MAJOR.MINOR, such as '{major}.{minor}'.")
        elif not (int(value.split(".")[0]) == major and int(value.split(".")[1]) >= minor):
            errors.append(f"{key} {value!r} must be {major}.{minor} or a later {major}.x.")
    if not re.fullmatch(r"[^\s@\"\\]+@[^\s@\"\\]+\.[^\s@\"\\]+", EMAIL):
        errors.append(f"email {EMAIL!r} must be an address such as 'you@example.com'.")
    if not re.fullmatch(r"\d+\.\d+a?(\+PTX)?([; ]\d+\.\d+a?(\+PTX)?)*", CUDA_ARCHS):
        errors.append(
            f"cuda_archs {CUDA_ARCHS!r} must be a TORCH_CUDA_ARCH_LIST such as '8.0;9.0+PTX'."
        )
    if errors:
        for error in errors:
            print(f"ERROR: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
