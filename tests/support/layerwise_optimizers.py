"""LAMB and LARS written from their papers, as the references of tests/test_recipes.sh (PyTorch
1.13 has neither). Each parameter tensor is one layer: its step is scaled by a ratio of norms
over the whole tensor.

LAMB: You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"
(ICLR 2020), Algorithm 2 with bias-corrected moments and phi the identity:
    m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  m^ = m / (1 - b1^t),  v^ = v / (1 - b2^t)
    r = m^ / (sqrt(v^) + eps),  x -= lr |x| / |r + wd x| (r + wd x)

LARS: You et al., "Large Batch Training of Convolutional Networks" (2017), Algorithm 1, with the
weight decay inside the local rate's denominator and an eps, and biases and normalisation
weights (tensors below 2-D) not adapted, as its implementations do:
    local = eta |w| / (|g| + wd |w| + eps),  d = local (g + wd w)
    v = m v + d (the first step: v = d),  w -= lr (Nesterov: d + m v; else v)
A ratio is 1 where either of its norms is 0. The norms are taken in fp64, as hpc_train sums
them: an fp32 norm over 10^5 squares is off by ~1e-6, which 20 steps of a trust ratio amplify
beyond the tests' 1e-5.
"""
import torch


def _norm(t):
    return t.double().norm()


def _ratio(numerator, denominator):
    return (numerator / denominator).item() if numerator > 0 and denominator > 0 else 1.0


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["t"] += 1
                t, m, v = state["t"], state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                r = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + group["eps"])
                update = r + group["weight_decay"] * p
                p.sub_(group["lr"] * _ratio(_norm(p), _norm(update)) * update)


class Lars(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum=0.0, nesterov=False, weight_decay=0.0,
                 trust_coefficient=1e-3, eps=1e-8):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                local = 1.0
                if p.dim() >= 2:
                    w_norm, g_norm = _norm(p), _norm(p.grad)
                    local = _ratio(group["trust_coefficient"] * w_norm,
                                   g_norm + wd * w_norm + group["eps"]) if g_norm > 0 else 1.0
                d = (p.grad + wd * p) * local
                if momentum != 0:
                    state = self.state[p]
                    if "v" not in state:
                        state["v"] = d.clone()
                    else:
                        state["v"].mul_(momentum).add_(d)
                    d = d + momentum * state["v"] if group["nesterov"] else state["v"]
                p.sub_(group["lr"] * d)
