// A Generation stub on a router's gRPC address whose channel has connected: what every serving
// test that talks to a cluster's router starts with.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "proto/pdserve.grpc.pb.h"

namespace pdserve::testing {

// Null when the channel does not connect within `wait`.
inline std::unique_ptr<v1::Generation::Stub> connected_generation_stub(
    const std::string& address, std::chrono::seconds wait = std::chrono::seconds(10)) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + wait)) return nullptr;
  return v1::Generation::NewStub(channel);
}

}  // namespace pdserve::testing
