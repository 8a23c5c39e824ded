// A model saved from Python as TorchScript, trained like a built-in one (Note [Two kinds of
// model] in models.h). In Python:
//
//   model = Net(...)                              # an nn.Module: float NCHW images -> logits
//   torch.jit.script(model).save("net.pt")        # or torch.jit.trace(model, example)
//   # hpc_train --model net.pt ...
//
// The module's parameters go into the flat buffers and buckets, its buffers (BatchNorm
// statistics) are broadcast and checkpointed, train/eval switches its `training` flags (which
// dropout and BatchNorm read), and --precision casts it as it casts a built-in network (fp32
// master weights in the optimizer). Its code runs in TorchScript's interpreter operator by
// operator, as eager PyTorch would run it (Note [Scripted module executor] in
// scripted_model.cpp). A traced module runs the mode it was traced in: tracing
// records the branches taken, so script a module whose dropout or BatchNorm must follow
// train/eval.
#pragma once

#include <memory>
#include <string>

#include "hpc_train/model/models.h"

namespace hpc_train {

// Loads the TorchScript file `path` (onto the CPU, in training mode) and checks it before any
// training: throws DataError naming the file and what to do when it is not a TorchScript file
// (not a zip archive, a torch.save file, or one LibTorch cannot load), when it was saved in a
// newer file format version than this LibTorch reads (both versions named), when it has no
// forward method or its forward does not take one tensor and return one, when its parameters
// are not all floating-point tensors that require gradients, when its forward does not map
// a batch of the dataset's images [2, C, H, W] to logits [2, num_classes] (one forward in eval
// mode without gradients, which changes no buffer), or when a parameter gets no gradient from
// the logits in training mode (one forward and backward, whose buffer updates and random draws
// are undone; Note [Unused parameters] in scripted_model.cpp), naming every such parameter.
std::unique_ptr<TrainableModel> load_scripted_model(const std::string& path,
                                                    const ModelShape& shape);

}  // namespace hpc_train
