// spotmorph on Azure: a controller VM with a user-assigned managed identity, a Spot VM scale set
// (Flexible orchestration, Delete eviction policy, singlePlacementGroup false), the network, and an
// Azure Files NFS share for checkpoints. Deploy into an empty resource group (docs/azure.md).
// main.json is the same template as ARM JSON, so it deploys without the Bicep tool; a test checks
// that both declare the same parameters, resources and key properties.

@description('Prefix of every resource name (letters and digits, 3-11 characters).')
@minLength(3)
@maxLength(11)
param prefix string = 'spotmorph'

param location string = resourceGroup().location

@description('Admin user of the VMs (SSH key only).')
param adminUsername string = 'azureuser'

@description('SSH public key for adminUsername.')
param sshPublicKey string

@description('Size of the Spot VMs that train (one agent each).')
param workerVmSize string = 'Standard_NC24ads_A100_v4'

@description('Size of the controller VM (no GPU needed).')
param controllerVmSize string = 'Standard_D2s_v5'

@description('VMs the scale set starts with; the controller keeps it at its own target_capacity afterwards.')
@minValue(0)
@maxValue(1000)
param workerCount int = 0

@description('USD per hour a Spot VM may cost; -1: up to the pay-as-you-go price.')
param maxPrice string = '-1'

@description('Rendered deploy/cloud-init/agent.yaml, base64 (`spotmorph azure cloud-init ... | base64 -w0`).')
@secure()
param agentCloudInit string

var vmssName = '${prefix}-spot'
var storageName = toLower('${prefix}${uniqueString(resourceGroup().id)}')
// Virtual Machine Contributor: scale the set, delete its VMs, run each new VM's agent-token Run Command
// (and join their NICs to the subnet).
var vmContributorRoleId = '9980e02c-c2be-4d73-94e8-173b1dc7cf3c'
var ubuntu = {
  publisher: 'Canonical'
  offer: '0001-com-ubuntu-server-jammy'
  sku: '22_04-lts-gen2'
  version: 'latest'
}
// The Spot VMs boot Azure's Ubuntu HPC image: the NVIDIA driver, CUDA and NCCL come with it, so a VM
// trains as soon as it is up (the NvidiaGpuDriverLinux extension would install a driver for minutes on
// every new VM, and an agent started before it finished would register without GPUs).
var workerImage = {
  publisher: 'microsoft-dsvm'
  offer: 'ubuntu-hpc'
  sku: '2204'
  version: 'latest'
}
var linux = {
  disablePasswordAuthentication: true
  ssh: {
    publicKeys: [
      {
        path: '/home/${adminUsername}/.ssh/authorized_keys'
        keyData: sshPublicKey
      }
    ]
  }
}

resource nsg 'Microsoft.Network/networkSecurityGroups@2023-09-01' = {
  name: '${prefix}-nsg'
  location: location
  properties: {
    securityRules: [
      {
        name: 'ssh'
        properties: {
          priority: 100
          direction: 'Inbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: '*'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '22'
        }
      }
    ]
  }
}

resource vnet 'Microsoft.Network/virtualNetworks@2023-09-01' = {
  name: '${prefix}-vnet'
  location: location
  properties: {
    addressSpace: {
      addressPrefixes: [
        '10.40.0.0/16'
      ]
    }
    subnets: [
      {
        name: 'cluster'
        properties: {
          addressPrefix: '10.40.0.0/20'
          networkSecurityGroup: {
            id: nsg.id
          }
          serviceEndpoints: [
            {
              service: 'Microsoft.Storage'
            }
          ]
        }
      }
    ]
  }
}

resource storage 'Microsoft.Storage/storageAccounts@2023-01-01' = {
  name: take(storageName, 24)
  location: location
  kind: 'FileStorage'
  sku: {
    name: 'Premium_LRS'
  }
  properties: {
    supportsHttpsTrafficOnly: false // NFS 4.1 shares need it off; traffic stays in the virtual network
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    networkAcls: {
      defaultAction: 'Deny'
      bypass: 'AzureServices'
      virtualNetworkRules: [
        {
          id: vnet.properties.subnets[0].id
          action: 'Allow'
        }
      ]
    }
  }
}

resource fileService 'Microsoft.Storage/storageAccounts/fileServices@2023-01-01' = {
  parent: storage
  name: 'default'
}

resource share 'Microsoft.Storage/storageAccounts/fileServices/shares@2023-01-01' = {
  parent: fileService
  name: 'checkpoints'
  properties: {
    enabledProtocols: 'NFS'
    rootSquash: 'NoRootSquash'
    shareQuota: 1024
  }
}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${prefix}-controller'
  location: location
}

resource controllerIp 'Microsoft.Network/publicIPAddresses@2023-09-01' = {
  name: '${prefix}-controller-ip'
  location: location
  sku: {
    name: 'Standard'
  }
  properties: {
    publicIPAllocationMethod: 'Static'
  }
}

resource controllerNic 'Microsoft.Network/networkInterfaces@2023-09-01' = {
  name: '${prefix}-controller-nic'
  location: location
  properties: {
    ipConfigurations: [
      {
        name: 'ipconfig'
        properties: {
          subnet: {
            id: vnet.properties.subnets[0].id
          }
          privateIPAllocationMethod: 'Static'
          privateIPAddress: '10.40.0.4'
          publicIPAddress: {
            id: controllerIp.id
          }
        }
      }
    ]
  }
}

resource controller 'Microsoft.Compute/virtualMachines@2024-03-01' = {
  name: '${prefix}-controller'
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    hardwareProfile: {
      vmSize: controllerVmSize
    }
    osProfile: {
      computerName: '${prefix}-controller'
      adminUsername: adminUsername
      linuxConfiguration: linux
    }
    storageProfile: {
      imageReference: ubuntu
      osDisk: {
        createOption: 'FromImage'
        managedDisk: {
          storageAccountType: 'Premium_LRS'
        }
      }
    }
    networkProfile: {
      networkInterfaces: [
        {
          id: controllerNic.id
        }
      ]
    }
  }
}

resource vmss 'Microsoft.Compute/virtualMachineScaleSets@2024-03-01' = {
  name: vmssName
  location: location
  sku: {
    name: workerVmSize
    tier: 'Standard'
    capacity: workerCount
  }
  properties: {
    orchestrationMode: 'Flexible'
    platformFaultDomainCount: 1
    singlePlacementGroup: false
    virtualMachineProfile: {
      priority: 'Spot'
      evictionPolicy: 'Delete'
      billingProfile: {
        maxPrice: json(maxPrice)
      }
      osProfile: {
        computerNamePrefix: prefix
        adminUsername: adminUsername
        linuxConfiguration: linux
        customData: agentCloudInit
      }
      storageProfile: {
        imageReference: workerImage
        osDisk: {
          createOption: 'FromImage'
          diskSizeGB: 128 // the HPC image plus a venv with the CUDA build of torch
          managedDisk: {
            storageAccountType: 'Premium_LRS'
          }
        }
      }
      networkProfile: {
        networkApiVersion: '2020-11-01'
        networkInterfaceConfigurations: [
          {
            name: 'nic'
            properties: {
              primary: true
              ipConfigurations: [
                {
                  name: 'ipconfig'
                  properties: {
                    subnet: {
                      id: vnet.properties.subnets[0].id
                    }
                  }
                }
              ]
            }
          }
        ]
      }
      scheduledEventsProfile: {
        terminateNotificationProfile: {
          enable: true
          notBeforeTimeout: 'PT5M'
        }
      }
    }
  }
}

// The controller's identity may manage VMs in this resource group, which holds only this cluster:
// Flexible scale-set VMs are resources of the group (not children of the set), so the set alone
// is not enough a scope to list and delete them.
resource role 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, identity.id, vmContributorRoleId)
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', vmContributorRoleId)
  }
}

output controllerPublicIp string = controllerIp.properties.ipAddress
output controllerPrivateIp string = '10.40.0.4'
output identityClientId string = identity.properties.clientId
output scaleSetName string = vmss.name
output storageAccountName string = storage.name
