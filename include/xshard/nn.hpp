#pragma once
/// \file
/// Tensor-parallel layers with forward and backward (`xshard::nn`): linear (column- and
/// row-parallel), activations, attention, embedding and cross-entropy, layer normalisation,
/// transformer blocks, and the `sequential` container.

#include <xshard/nn/activation.hpp>
#include <xshard/nn/attention.hpp>
#include <xshard/nn/blocks.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/nn/layer_normalization.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/nn/module.hpp>
