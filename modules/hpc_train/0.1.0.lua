-- Lmod modulefile for an installed hpc_train 0.1.0.
--   module use /path/to/hpc_train/modules && module load hpc_train
-- The install prefix: HPC_TRAIN_PREFIX when set, else /opt/hpc_train/0.1.0 (cmake --install
-- also writes a copy of this file with its own prefix filled in, under share/modulefiles).
local version = "0.1.0"
local root = os.getenv("HPC_TRAIN_PREFIX") or "/opt/hpc_train/" .. version

help([[
hpc_train ]] .. version .. [[: data-parallel training of image classifiers on GPU clusters
(MPI + NCCL + LibTorch + HDF5).

  mpirun -np 3 hpc_train --dataset data.h5        train (one rank per GPU)
  hpc_train --help                                 every option, grouped
  hpc_train_data convert fashion-mnist SRC OUT.h5  make a dataset file
]])

whatis("Name: hpc_train")
whatis("Version: " .. version)
whatis("Description: data-parallel training (MPI, NCCL, LibTorch, HDF5)")

-- Load the site's MPI, CUDA and HDF5 modules where the site has them.
for _, dependency in ipairs({"openmpi", "cuda", "hdf5"}) do
  if not isloaded(dependency) and isAvail(dependency) then
    load(dependency)
  end
end

setenv("HPC_TRAIN_ROOT", root)
prepend_path("PATH", pathJoin(root, "bin"))
prepend_path("LD_LIBRARY_PATH", pathJoin(root, "lib"))
