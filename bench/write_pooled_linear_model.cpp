// write_pooled_linear_model: the cheapest model hpc_train can train on an image dataset, as a
// TorchScript file (--model FILE.pt): the mean of each channel, then one linear layer. For
// bench/data_bench.sh, where the data path, not the arithmetic, must set the pace.
//   write_pooled_linear_model OUT.pt CHANNELS CLASSES
#include <torch/script.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s OUT.pt CHANNELS CLASSES\n", argv[0]);
    return 2;
  }
  const int64_t channels = std::stoll(argv[2]);
  const int64_t classes = std::stoll(argv[3]);
  torch::jit::Module model("PooledLinear");
  model.register_parameter("weight",
                           (torch::randn({classes, channels}) * 0.01).requires_grad_(), false);
  model.register_parameter("bias", torch::zeros({classes}).requires_grad_(), false);
  model.define(R"(
def forward(self, x):
    return torch.addmm(self.bias, x.mean([2, 3]), self.weight.t())
)");
  model.save(argv[1]);
  return 0;
}
