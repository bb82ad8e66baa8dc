#pragma once
/// \file
/// Training over parameter containers: parameters, weights and their traversal (param/),
/// parameter broadcast, gradient synchronisation and fusion, optimizer sharding (`hsdp`),
/// gradient norms and the loss monitor (train/), optimizers and learning-rate schedules
/// (optim/).

#include <xshard/optim/optimizers.hpp>
#include <xshard/optim/schedules.hpp>
#include <xshard/param/parameter.hpp>
#include <xshard/param/tensor_record.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/train/broadcast.hpp>
#include <xshard/train/fusion.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp.hpp>
#include <xshard/train/monitor.hpp>
#include <xshard/train/norms.hpp>
