#!/usr/bin/env python3
"""The Spack recipe (packaging/spack/hpc-train/package.py) against the CMake build.

Spack is not needed: the recipe is parsed with Python's ast, not imported. Checks that
  - it is valid Python and defines class HpcTrain(CMakePackage, CudaPackage);
  - every package a find_package call of CMakeLists.txt, cmake/*.cmake or tests/ looks for has
    its depends_on (the Spack name from CMAKE_TO_SPACK below), with the minimum version the
    find_package call asks for, the spec fragments it needs (hdf5+mpi, boost+program_options),
    the when= condition of a conditional find_package (nccl only +cuda) and type="test" for the
    tests' own;
  - and vice versa: every depends_on is one of those or a build tool (BUILD_TOOLS).
Usage: test_spack_recipe.py SOURCE_DIR. Exit 0 when all hold, 1 with every mismatch listed.
"""
import ast
import pathlib
import re
import sys

# CMake package -> what the recipe must say. None: nothing to depend on (the compiler's threads;
# git, which only names the commit in --version when there is one).
CMAKE_TO_SPACK = {
    "MPI": {"name": "mpi"},
    "HDF5": {"name": "hdf5", "fragments": ["+mpi"]},
    "Boost": {"name": "boost", "fragments": ["+program_options"]},
    "nlohmann_json": {"name": "nlohmann-json"},
    "ZLIB": {"name": "zlib-api"},
    "Torch": {"name": "py-torch"},  # Spack's LibTorch is py-torch's
    "NCCL": {"name": "nccl", "when": "+cuda"},
    "JPEG": {"name": "jpeg", "when": "+images"},  # Spack's virtual (libjpeg-turbo, libjpeg)
    "PNG": {"name": "libpng", "when": "+images"},
    "GTest": {"name": "googletest", "type": "test"},
    "Threads": None,
    "Git": None,
}
# Dependencies that no find_package call stands for.
BUILD_TOOLS = {"cmake", "c", "cxx"}

FIND_PACKAGE = re.compile(r"\bfind_package\s*\(\s*([A-Za-z0-9_]+)(?:\s+([0-9][0-9.]*))?")


def cmake_find_packages(source_dir):
    """{package: {"version": str or None, "files": [...]}} over the build's CMake files."""
    files = [source_dir / "CMakeLists.txt", *sorted((source_dir / "cmake").glob("*.cmake")),
             source_dir / "tests" / "CMakeLists.txt", *sorted((source_dir / "tests").glob("*.cmake"))]
    found = {}
    for path in files:
        # CMake comments run from # to the end of the line (no # inside our find_package calls).
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        for match in FIND_PACKAGE.finditer(text):
            entry = found.setdefault(match.group(1), {"version": None, "files": []})
            entry["files"].append(str(path.relative_to(source_dir)))
            if match.group(2):
                entry["version"] = match.group(2)
    return found


def spec_text(node):
    """The text of a spec argument: a string, or an f-string's literal parts (holes as {})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    return None


def recipe_depends_on(recipe_path):
    """[(name, spec, when, type)] of the depends_on calls in class HpcTrain, and the class's bases."""
    tree = ast.parse(recipe_path.read_text(), filename=str(recipe_path))
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "HpcTrain"]
    if len(classes) != 1:
        raise SystemExit(f"FAIL: {recipe_path}: no class HpcTrain")
    bases = [base.id for base in classes[0].bases if isinstance(base, ast.Name)]
    dependencies = []
    for node in ast.walk(classes[0]):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "depends_on"):
            continue
        spec = spec_text(node.args[0]) if node.args else None
        if spec is None:
            raise SystemExit(f"FAIL: {recipe_path}:{node.lineno}: depends_on without a literal spec")
        keywords = {kw.arg: spec_text(kw.value) for kw in node.keywords}
        name = re.match(r"[A-Za-z0-9_-]+", spec.strip()).group(0)
        dependencies.append((name, spec, keywords.get("when") or "", keywords.get("type") or ""))
    return bases, dependencies


def main():
    source_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    recipe_path = source_dir / "packaging" / "spack" / "hpc-train" / "package.py"
    bases, dependencies = recipe_depends_on(recipe_path)
    find_packages = cmake_find_packages(source_dir)
    problems = []
    if bases != ["CMakePackage", "CudaPackage"]:
        problems.append(f"class HpcTrain's bases are {bases}, not CMakePackage, CudaPackage")

    by_name = {}
    for name, spec, when, dep_type in dependencies:
        by_name.setdefault(name, []).append((spec, when, dep_type))

    for package, entry in sorted(find_packages.items()):
        where = ", ".join(sorted(set(entry["files"])))
        if package not in CMAKE_TO_SPACK:
            problems.append(f"find_package({package}) in {where}: not in CMAKE_TO_SPACK of "
                            f"{pathlib.Path(__file__).name}; add its Spack package there and a "
                            f"depends_on to {recipe_path.relative_to(source_dir)}")
            continue
        expected = CMAKE_TO_SPACK[package]
        if expected is None:
            continue
        name = expected["name"]
        specs = by_name.get(name)
        if not specs:
            problems.append(f"find_package({package}) in {where}: no depends_on(\"{name}\") in the recipe")
            continue
        # The unconditional (or the one +cuda) depends_on that carries the requirements.
        main_spec, when, dep_type = specs[0]
        if entry["version"] and f"@{entry['version']}:" not in main_spec:
            problems.append(f"find_package({package} {entry['version']}): depends_on(\"{main_spec}\") "
                            f"lacks @{entry['version']}:")
        for fragment in expected.get("fragments", []):
            if fragment not in main_spec:
                problems.append(f"find_package({package}): depends_on(\"{main_spec}\") lacks {fragment}")
        if when != expected.get("when", ""):
            problems.append(f"find_package({package}): depends_on(\"{main_spec}\") has when="
                            f"'{when}', not '{expected.get('when', '')}'")
        if expected.get("type", "") not in dep_type:
            problems.append(f"find_package({package}): depends_on(\"{main_spec}\") has type="
                            f"'{dep_type}', not '{expected['type']}'")

    wanted = {spec["name"] for package, spec in CMAKE_TO_SPACK.items()
              if spec is not None and package in find_packages}
    for name in sorted(set(by_name) - wanted - BUILD_TOOLS):
        problems.append(f"depends_on(\"{name}\") in the recipe: no find_package call needs it")

    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        return 1
    print(f"recipe: {len(dependencies)} depends_on calls over {len(by_name)} packages; "
          f"CMake: {len(find_packages)} find_package names ({', '.join(sorted(find_packages))})")
    print("spack recipe test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
