# Spack package recipe for hpc_train. There is no release archive to fetch: build a checkout.
#   spack repo create ~/hpc-train-repo hpc_train_site
#   cp -r packaging/spack/hpc-train ~/hpc-train-repo/packages/
#   spack repo add ~/hpc-train-repo
#   spack develop --path /path/to/hpc_train --no-clone hpc-train@0.1.0
#   spack install hpc-train@0.1.0 +cuda cuda_arch=90 ^openmpi      # GPU build for H100/H200
#   spack install hpc-train@0.1.0 ~cuda                             # CPU build
# Written for Spack 0.22/0.23 (`from spack.package import *`, the c/cxx language virtuals). Spack
# 1.0 moved the build systems out of spack.package: there, import CMakePackage and CudaPackage from
# spack_repo.builtin.build_systems.cmake / .cuda and put the directory under
# <repo>/spack_repo/<namespace>/packages/hpc_train/.
# The dependencies are those of CMakeLists.txt and cmake/HpcTrainDependencies.cmake;
# tests/test_spack_recipe.py (CTest test_spack_recipe) checks that the two stay in step.

from spack.package import *


class HpcTrain(CMakePackage, CudaPackage):
    """Data-parallel training of image classifiers on GPU clusters: MPI + NCCL + LibTorch +
    HDF5, with Slurm job scripts and Lmod/Tcl modulefiles."""

    version("0.1.0")

    # CudaPackage adds the variants cuda and cuda_arch, and depends_on("cuda") when +cuda.

    depends_on("cmake@3.18:", type="build")
    depends_on("c", type="build")
    depends_on("cxx", type="build")

    # Any MPI provider (openmpi, mpich, mvapich2, cray-mpich, ...).
    depends_on("mpi")
    # Parallel HDF5 (collective reads over MPI-IO); the build also accepts a serial one.
    depends_on("hdf5+mpi")
    depends_on("boost@1.71:+program_options")
    depends_on("nlohmann-json@3.9:")
    depends_on("zlib-api")
    # LibTorch: Spack has no libtorch package. py-torch installs LibTorch (the C++ libraries and
    # their CMake config, under site-packages/torch/share/cmake/Torch), and its
    # cmake_prefix_paths puts that on CMAKE_PREFIX_PATH, where find_package(Torch) finds it.
    depends_on("py-torch@1.13:")
    depends_on("py-torch~cuda", when="~cuda")
    depends_on("py-torch+cuda", when="+cuda")
    # NCCL for the GPU collectives (CMakeLists.txt looks for it when LibTorch has CUDA).
    depends_on("nccl", when="+cuda")
    for arch in CudaPackage.cuda_arch_values:
        depends_on(f"py-torch cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")
        depends_on(f"nccl cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")

    # libjpeg(-turbo) and libpng decode the images of `hpc_train_data convert imagefolder`;
    # optional in CMake (a build without them refuses that converter).
    variant("images", default=True, description="convert imagefolder: JPEG and PNG decoding")
    depends_on("jpeg", when="+images")  # the virtual: libjpeg-turbo or libjpeg
    depends_on("libpng", when="+images")

    depends_on("googletest", type="test")

    def cmake_args(self):
        args = [self.define("HPC_TRAIN_BUILD_TESTS", self.run_tests)]
        if self.spec.satisfies("~images"):
            # Not a system libjpeg/libpng that CMake would find outside Spack's.
            args.append(self.define("CMAKE_DISABLE_FIND_PACKAGE_JPEG", True))
            args.append(self.define("CMAKE_DISABLE_FIND_PACKAGE_PNG", True))
        if self.spec.satisfies("+cuda"):
            # The architectures of our own kernels (src/**/*.cu); LibTorch's are py-torch's.
            cuda_arch = self.spec.variants["cuda_arch"].value
            if cuda_arch and "none" not in cuda_arch:
                args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(cuda_arch)))
            args.append(self.define("NCCL_ROOT", self.spec["nccl"].prefix))
        return args
