#pragma once
/// \file
/// Convolutional networks and spatial parallelism: conv2d, pooling, batch normalisation,
/// flatten, global pooling and ResNet's residual blocks (nn/), their sharding rules and local
/// kernels (oneDNN) and the spatial operators that exchange halos (ops/).

#include <xshard/nn/batch_norm2d.hpp>
#include <xshard/nn/conv2d.hpp>
#include <xshard/nn/flatten.hpp>
#include <xshard/nn/global_pooling.hpp>
#include <xshard/nn/kept_halo.hpp>
#include <xshard/nn/pooling.hpp>
#include <xshard/nn/resnet_blocks.hpp>
#include <xshard/nn/step_profile.hpp>
#include <xshard/ops/conv.hpp>
#include <xshard/ops/conv_kernels.hpp>
#include <xshard/ops/conv_rule.hpp>
#include <xshard/ops/spatial.hpp>
