-- Lmod modulefile for an installed hpc_train 0.1.0.
--   module use /path/to/hpc_train/modules && module load hpc_train
-- The install prefix: HPC_TRAIN_PREFIX when set, else /opt/hpc_train/0.1.0 (cmake --install
-- also writes a copy of this file with its own prefix filled in, under share/modulefiles).
local version = "0.1.0"
local root = os.getenv("HPC_TRAIN_PREFIX") or "/opt/hpc_train/" .. version
-- The MPI, HDF5 and CUDA hpc_train was built with: their bin and lib directories outside the
-- system's, recorded when the build was configured. cmake --install fills them in (the line
-- below, exactly, is replaced by cmake/HpcTrainWriteModulefiles.cmake). The repository's copy
-- records none (nil) and loads the site's modules instead.
local built_with = nil

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

-- One hpc_train at a time (Lmod swaps versions by itself; Environment Modules needs this).
conflict("hpc_train")

-- prepend_existing(variable, dirs): prepends the directories of dirs that exist, the first of
-- dirs ending up first. A path that does not exist (another node's layout, a removed MPI) is
-- not added: it would only slow every lookup down.
local function prepend_existing(variable, dirs)
  for i = #dirs, 1, -1 do
    if isDir(dirs[i]) then
      prepend_path(variable, dirs[i])
    end
  end
end

if built_with then
  -- The libraries the build linked against, not whatever the site's default modules are now.
  prepend_existing("PATH", built_with.bin_dirs)
  prepend_existing("LD_LIBRARY_PATH", built_with.lib_dirs)
else
  -- Load the site's MPI, CUDA and HDF5 modules where the site has them.
  for _, dependency in ipairs({"openmpi", "cuda", "hdf5"}) do
    if not isloaded(dependency) and isAvail(dependency) then
      load(dependency)
    end
  end
end

setenv("HPC_TRAIN_ROOT", root)
prepend_existing("PATH", {pathJoin(root, "bin")})
prepend_existing("LD_LIBRARY_PATH", {pathJoin(root, "lib")})
