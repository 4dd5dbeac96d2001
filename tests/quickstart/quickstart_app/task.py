"""Model, data and training loops, as in Flower's quickstart-pytorch (MNIST offline)."""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedgsp_flwr.data import (
    Partition,
    PartitionSpec,
    client_data,
    get_bundle,
    partition_dataset,
    read_partitions,
    save_partitions,
)
from fedgsp_flwr.data.partition import transform
from fedgsp_flwr.data.sources import default_cache_dir


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz', 1 x 28 x 28 input)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@lru_cache(maxsize=1)
def _bundle(train_examples: int):
    return get_bundle("mnist", str(default_cache_dir()), 0, 1.0, 1.0, 0, train_examples, 2000)


def _shards(num_partitions: int, train_examples: int) -> list[Partition]:
    """Two label shards a node, cached on disk: a SuperNode starts a process per
    message, and partitioning imports flwr-datasets (11 s of a 13 s load beside another
    run, 2026-12-02).
    """
    path = default_cache_dir() / "quickstart-app" / f"shards-{num_partitions}-{train_examples}.npz"
    if path.exists():
        return read_partitions(path)
    parts = partition_dataset(_bundle(train_examples), PartitionSpec("shards", num_partitions,
                                                                     seed=0))
    save_partitions(parts, path)
    return parts


@lru_cache(maxsize=16)
def _partition(partition_id: int, num_partitions: int,
               train_examples: int) -> tuple[TensorDataset, TensorDataset]:
    bundle = _bundle(train_examples)
    data = client_data(bundle, _shards(num_partitions, train_examples)[partition_id])
    return (TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
            TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)))


def load_data(partition_id: int, num_partitions: int,
              train_examples: int = 6000) -> tuple[DataLoader, DataLoader]:
    """The node's partition of MNIST (2 label shards), as train and test DataLoaders
    (shuffled by a generator of the partition id: runs repeat exactly).
    """
    train, test = _partition(partition_id, num_partitions, train_examples)
    generator = torch.Generator().manual_seed(partition_id)
    return (DataLoader(train, batch_size=32, shuffle=True, generator=generator),
            DataLoader(test, batch_size=32))


def load_centralized_dataset(train_examples: int = 6000) -> DataLoader:
    """The server's test set."""
    bundle = _bundle(train_examples)
    x, y = transform(bundle, bundle.x_test, bundle.y_test, 0, 0)
    return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=128)


def train(net: nn.Module, trainloader: DataLoader, epochs: int, lr: float) -> float:
    """Train the model on the training set."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: nn.Module, testloader: DataLoader) -> tuple[float, float]:
    """Validate the model on the test set."""
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
